/*
 * zs_shard_nvme.c - the shard over the NVMe tier (zs-server --nvme-path):
 * p, m, v in a tile file (zs_nvme.h) instead of RAM arrays, and the pushed
 * gradients staged in the same file's gradient region (zs_shard_push.c
 * writes each received chunk there from a budgeted buffer). The 16-bit
 * copy for pulls stays in RAM (2 B/element) when the budget has room for
 * it, with the tier's I/O buffers; otherwise the state has none, and pulls
 * cast the master weights read from the tiles (the same bits: the kernel's
 * 16-bit output is that cast).
 *
 * Same results as RAM, bitwise: tile c is optimizer chunk c, and the pass
 * calls the same kernel (zs_adam_update_from) on the same spans with the
 * same inputs; only where p, m, v sit differs.
 *
 * Readers. A tile's slot flips, and its chunk's done step moves, together
 * under the chunk's lock once its write has landed, so a pull sees either
 * the old tile and the old step or the new ones. Until then the pass marks
 * the chunk's 16-bit copy stale (it already holds the new step), so a pull
 * of the old step casts the old tile's master weights instead.
 *
 * Speculation (zs_shard_spec.c's model). A speculative update of chunk c
 * reads its tile, updates it and writes it aside, to the slot that is not
 * current (zs_nvme_write_aside): the current slot is the pre-image, on the
 * drive, so no RAM pre-image is kept. Until Commit, readers see the
 * committed tile (its 16-bit copy is marked stale). A Commit that keeps the
 * update only flips the tile (the pass skips it); a rollback runs the real
 * update from the current slot, which overwrites the aside one; a cancel
 * does nothing on the drive.
 *
 * Not here: the manifest-of-tiles checkpoint (a checkpoint copies the
 * tiles into RocksDB, 12 B/element, as the RAM path does).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cast.h"
#include "zs_log.h"
#include "zs_shard_internal.h"

/* ---- states ---------------------------------------------------------------- */

uint64_t zs__state_bytes(const zs_shard_t *sh, uint64_t n)
{
    if (!sh->nvme)
        return zs_shard_state_bytes(n);
    /* lowp 2 B/element and its rounding, chunk tables, the tier's records */
    return zs_shard_state_bytes(n) - 20 * n - 5 * 64 + zs_nvme_state_ram_bytes(n);
}

static void *alloc64(uint64_t bytes)
{
    return aligned_alloc(64, (size_t)((bytes ? bytes : 64) + 63) & ~(size_t)63);
}

int zs__state_reserve(zs_shard_t *sh, uint64_t n, const char *what, uint64_t *bytes, int *lowp,
                      zs_err_t *err)
{
    *bytes = zs__state_bytes(sh, n);
    *lowp = 1;
    /* Test hook: ZS_NVME_TEST_NO_LOWP=1 builds every state without the
     * copy, as if it did not fit (logged below). */
    const char *no = sh->nvme ? getenv("ZS_NVME_TEST_NO_LOWP") : NULL;
    int rc = no && no[0] == '1' ? zs_err_set(err, ZS_ERR_NOMEM, "ZS_NVME_TEST_NO_LOWP")
                                : zs_budget_take(&sh->budget, *bytes, what, err);
    if (rc != ZS_ERR_NOMEM || !sh->nvme)
        return rc;
    uint64_t less = *bytes - (2 * n + 64); /* without the 16-bit copy */
    zs_err_t e2;
    if (zs_budget_take(&sh->budget, less, what, &e2) != ZS_OK)
        return rc; /* the first refusal says what the whole state needs */
    if (no && no[0] == '1')
        ZS_WARN("nvme: test hook ZS_NVME_TEST_NO_LOWP: a state of %llu elements without its "
                "16-bit copy: pulls cast the master weights read from the tiles",
                (unsigned long long)n);
    else
        ZS_INFO("nvme: the 16-bit copy of %llu elements (%.1f MB) does not fit the memory "
                "budget: pulls cast the master weights read from the tiles",
                (unsigned long long)n, (double)(2 * n) / 1e6);
    *bytes = less;
    *lowp = 0;
    return ZS_OK;
}

int zs__state_alloc_tier(zs_shard_t *sh, zs__state_t *s, uint64_t n, int lowp, zs_err_t *err)
{
    if (!sh->nvme) {
        if (zs__state_alloc(s, n))
            return zs_err_set(err, ZS_ERR_NOMEM, "cannot allocate state for %llu elements",
                              (unsigned long long)n);
        return ZS_OK;
    }
    memset(s, 0, sizeof *s); /* staging: in the tile file */
    if (lowp && !(s->lowp = alloc64(n * 2))) {
        zs__state_free(s);
        return zs_err_set(err, ZS_ERR_NOMEM, "cannot allocate the 16-bit copy of %llu elements",
                          (unsigned long long)n);
    }
    int rc = zs_nvme_state_create(sh->nvme, n, &s->nv, err);
    if (rc)
        zs__state_free(s);
    return rc;
}

/* ---- the pass -------------------------------------------------------------- */

/* A speculated chunk: kept (written aside: only to be flipped), or not. */
static int tile_skip(void *ud, size_t c)
{
    zs__opt_pass_t *op = ud;
    zs_shard_t *sh = op->sh;
    if (op->spec == ZS__JOB_PLAIN)
        return 0;
    const float *pre;
    pthread_mutex_lock(&sh->chunk_mu[c]);
    int keep = zs__spec_pass_chunk(sh, c, op->spec, &pre); /* rolled back: plain update */
    pthread_mutex_unlock(&sh->chunk_mu[c]);
    return keep;
}

/* One tile = one chunk: the RAM pass's call, on the tile's buffers. */
static int tile_update(void *ud, size_t c, float *p, float *m, float *v, const void *g, uint32_t k)
{
    zs__opt_pass_t *op = ud;
    zs_shard_t *sh = op->sh;
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK;
    pthread_mutex_lock(&sh->chunk_mu[c]);
    zs__shard_adam_from(sh, &sh->job_step, sh->job.lrs, sh->job.nlrs, a, p, m, v, p, m, v, g,
                        op->gdt, op->pdt == ZS_DTYPE_NONE || !sh->st.lowp ? NULL : sh->st.lowp + a,
                        op->pdt, (size_t)k);
    sh->lowp_ok[c] = 0; /* ahead of the tile until it lands */
    pthread_mutex_unlock(&sh->chunk_mu[c]);
    return 0;
}

static void tile_landed(void *ud, size_t c, void (*flip)(zs_nvme_state_t *, size_t),
                        zs_nvme_state_t *s)
{
    zs__opt_pass_t *op = ud;
    zs_shard_t *sh = op->sh;
    pthread_mutex_lock(&sh->chunk_mu[c]);
    flip(s, c);
    /* no 16-bit copy (the budget): pulls cast the tile's master weights */
    sh->lowp_ok[c] = op->pdt == ZS_DTYPE_NONE || !sh->st.lowp ? 0 : (unsigned char)(1 + op->pdt);
    atomic_store(&sh->done[c], op->step);
    pthread_mutex_unlock(&sh->chunk_mu[c]);
    pthread_mutex_lock(&sh->mu); /* wake pulls waiting for this chunk */
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

int zs__nvme_pass_run(zs_shard_t *sh, uint64_t step, zs_dtype_t gdt, zs_dtype_t pdt, int spec,
                      zs_err_t *err)
{
    zs__opt_pass_t op = {sh, step, gdt, pdt, NULL, spec};
    double io = 0;
    int rc = zs_nvme_pass(sh->nvme, sh->st.nv, step, gdt, sh->pool, tile_update, tile_skip,
                          tile_landed, &op, &io, err);
    if (rc) {
        ZS_ERROR("commit: step %llu failed in the NVMe tier: %s; refusing every call until a "
                 "restart resumes from the newest checkpoint",
                 (unsigned long long)step, err->msg);
        pthread_mutex_lock(&sh->mu);
        sh->tier_failed = 1;
        snprintf(sh->tier_error, sizeof sh->tier_error,
                 "step %llu failed, restart to resume from the newest checkpoint: %.250s",
                 (unsigned long long)step, err->msg);
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    } else {
        ZS_DEBUG("nvme: pass of step %llu waited %.1f ms for I/O", (unsigned long long)step,
                 io * 1e3);
    }
    /* The step's transient buffers (pushed chunks, pull and gRPC buffers)
     * were freed into the allocator's arenas: give their pages back, so
     * the resident memory stays near what the budget counts. */
    malloc_trim(0);
    return rc;
}

/* ---- speculation ----------------------------------------------------------------- */

int zs__nvme_spec_chunk(zs_shard_t *sh, size_t c, const zs_adam_step_t *adam, const float *lrs,
                        uint32_t nlrs, uint64_t step, zs_dtype_t gdt, zs_dtype_t pdt, zs_err_t *err)
{
    zs_nvme_buf_t b;
    int rc = zs_nvme_buf_alloc(&b, err);
    if (rc)
        return rc;
    void *grad = zs_nvme_mem_alloc(ZS_NVME_GSPAN);
    if (!grad) {
        zs_nvme_buf_free(&b);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for a gradient span");
    }
    uint64_t a = (uint64_t)c * ZS_OPT_CHUNK;
    pthread_mutex_lock(&sh->chunk_mu[c]);
    rc = zs_nvme_read(sh->st.nv, c, 7, &b, err);
    if (!rc)
        rc = zs_nvme_grad_read(sh->st.nv, c, step, gdt, grad, err);
    if (!rc) {
        uint32_t k = zs_nvme_tile_len(sh->st.nv, c);
        zs__shard_adam_from(
            sh, adam, lrs, nlrs, a, b.t[0], b.t[1], b.t[2], b.t[0], b.t[1], b.t[2], grad, gdt,
            pdt == ZS_DTYPE_NONE || !sh->st.lowp ? NULL : sh->st.lowp + a, pdt, (size_t)k);
        sh->lowp_ok[c] = 0; /* holds the uncommitted update: pulls read the tile */
        rc = zs_nvme_write_aside(sh->st.nv, c, &b, err);
    }
    pthread_mutex_unlock(&sh->chunk_mu[c]);
    zs_nvme_buf_free(&b);
    zs_nvme_mem_free(grad, ZS_NVME_GSPAN);
    return rc;
}

/* ---- readers and writers outside the pass ------------------------------------- */

int zs__nvme_pull_master(zs_shard_t *sh, size_t c, uint64_t s, uint64_t e, zs_dtype_t dt, void *out,
                         zs_nvme_buf_t *b, zs_err_t *err)
{
    int rc = zs_nvme_read(sh->st.nv, c, 1, b, err);
    if (!rc)
        zs_cast(out, dt, b->t[0] + (s - (uint64_t)c * ZS_OPT_CHUNK), ZS_DTYPE_F32, (size_t)(e - s));
    return rc;
}

int zs__nvme_get(zs_shard_t *sh, int t, uint64_t a, uint64_t count, float *dst, zs_err_t *err)
{
    zs_nvme_buf_t b;
    int rc = zs_nvme_buf_alloc(&b, err);
    for (uint64_t c = a / ZS_OPT_CHUNK; !rc && c * ZS_OPT_CHUNK < a + count; c++) {
        uint64_t s = c * ZS_OPT_CHUNK > a ? c * ZS_OPT_CHUNK : a;
        uint64_t e = (c + 1) * ZS_OPT_CHUNK < a + count ? (c + 1) * ZS_OPT_CHUNK : a + count;
        rc = zs_nvme_read(sh->st.nv, (size_t)c, 1u << t, &b, err);
        if (!rc)
            memcpy(dst + (s - a), b.t[t] + (s - c * ZS_OPT_CHUNK), (e - s) * 4);
    }
    zs_nvme_buf_free(&b);
    return rc;
}

int zs__nvme_set(zs_shard_t *sh, int t, uint64_t a, uint64_t count, const float *src, zs_err_t *err)
{
    zs_nvme_buf_t b;
    int rc = zs_nvme_buf_alloc(&b, err);
    for (uint64_t c = a / ZS_OPT_CHUNK; !rc && c * ZS_OPT_CHUNK < a + count; c++) {
        uint64_t s = c * ZS_OPT_CHUNK > a ? c * ZS_OPT_CHUNK : a;
        uint64_t e = (c + 1) * ZS_OPT_CHUNK < a + count ? (c + 1) * ZS_OPT_CHUNK : a + count;
        rc = zs_nvme_read(sh->st.nv, (size_t)c, 7, &b, err);
        if (!rc) {
            memcpy(b.t[t] + (s - c * ZS_OPT_CHUNK), src + (s - a), (e - s) * 4);
            pthread_mutex_lock(&sh->chunk_mu[c]);
            rc = zs_nvme_write(sh->st.nv, (size_t)c, &b, err);
            pthread_mutex_unlock(&sh->chunk_mu[c]);
        }
    }
    zs_nvme_buf_free(&b);
    return rc;
}

/* ---- sequential fill (Initialize, Restore) ---------------------------------- */

int zs__nvme_fill_begin(zs__nvme_fill_t *f, zs_nvme_state_t *s, zs_err_t *err)
{
    f->s = s;
    f->next = 0;
    return zs_nvme_buf_alloc(&f->b, err);
}

int zs__nvme_fill_add(zs__nvme_fill_t *f, const float *const src[3], uint64_t count, zs_err_t *err)
{
    uint64_t done = 0;
    while (done < count) {
        size_t c = (size_t)(f->next / ZS_NVME_TILE);
        if (c >= zs_nvme_ntiles(f->s))
            return zs_err_set(err, ZS_ERR_RANGE, "nvme: fill beyond the state's %zu tiles",
                              zs_nvme_ntiles(f->s));
        uint64_t o = f->next % ZS_NVME_TILE, k = zs_nvme_tile_len(f->s, c);
        uint64_t take = count - done < k - o ? count - done : k - o;
        for (int t = 0; t < 3; t++) {
            if (src[t])
                memcpy(f->b.t[t] + o, src[t] + done, take * 4);
            else
                memset(f->b.t[t] + o, 0, take * 4);
        }
        f->next += take;
        done += take;
        if (o + take == k) {
            int rc = zs_nvme_write(f->s, c, &f->b, err);
            if (rc)
                return rc;
        }
    }
    return ZS_OK;
}

void zs__nvme_fill_end(zs__nvme_fill_t *f)
{
    zs_nvme_buf_free(&f->b);
}

/* ---- checkpoints -------------------------------------------------------------- */

int zs__nvme_ckpt_fill(void *ud, int t, uint64_t off, void *dst, size_t len, zs_err_t *err)
{
    zs_nvme_state_t *s = ud;
    zs_nvme_buf_t b;
    int rc = zs_nvme_buf_alloc(&b, err);
    uint64_t a = off / 4, cnt = len / 4;
    for (uint64_t c = a / ZS_NVME_TILE; !rc && c * ZS_NVME_TILE < a + cnt; c++) {
        uint64_t s0 = c * ZS_NVME_TILE > a ? c * ZS_NVME_TILE : a;
        uint64_t e = (c + 1) * ZS_NVME_TILE < a + cnt ? (c + 1) * ZS_NVME_TILE : a + cnt;
        rc = zs_nvme_read(s, (size_t)c, 1u << t, &b, err);
        if (!rc)
            memcpy((float *)dst + (s0 - a), b.t[t] + (s0 - c * ZS_NVME_TILE), (e - s0) * 4);
    }
    zs_nvme_buf_free(&b);
    return rc;
}

int zs__nvme_restore(zs_shard_t *sh, uint64_t step, uint64_t n, zs__state_t *st, zs_err_t *err)
{
    const uint64_t per = ZS_STORE_CHUNK_BYTES / 4; /* elements per store chunk */
    float *buf[3] = {malloc(ZS_STORE_CHUNK_BYTES), malloc(ZS_STORE_CHUNK_BYTES),
                     malloc(ZS_STORE_CHUNK_BYTES)};
    zs__nvme_fill_t f;
    int rc = !buf[0] || !buf[1] || !buf[2] ? zs_err_set(err, ZS_ERR_NOMEM, "out of memory")
                                           : zs__nvme_fill_begin(&f, st->nv, err);
    int filling = rc == ZS_OK;
    for (uint64_t c = 0; !rc && c * per < n; c++) {
        size_t len = 0;
        pthread_mutex_lock(&sh->store_mu);
        for (int t = 0; !rc && t < 3; t++)
            rc = zs_store_read_chunk(sh->store, step, n, t, c, buf[t], &len, err);
        pthread_mutex_unlock(&sh->store_mu);
        if (!rc)
            rc = zs__nvme_fill_add(&f, (const float *const *)buf, len / 4, err);
    }
    if (filling)
        zs__nvme_fill_end(&f);
    for (int t = 0; t < 3; t++)
        free(buf[t]);
    return rc;
}
