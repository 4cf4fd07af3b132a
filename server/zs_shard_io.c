/*
 * zs_shard_io.c - reads and writes of shard state from outside the
 * optimizer: Pull (waits for the step), GetState and SetState.
 *
 * Readers copy chunk by chunk under each chunk's lock, counted in
 * sh->readers so nothing frees or replaces the arrays under them.
 */
#include <string.h>

#include "zs_cast.h"
#include "zs_shard_internal.h"

/* Are all chunks overlapping [a, b) (shard-relative) at step >= s? mu held. */
static int chunks_ready(zs_shard_t *sh, uint64_t a, uint64_t b, uint64_t s)
{
    for (uint64_t c = a / ZS_OPT_CHUNK; c * ZS_OPT_CHUNK < b; c++)
        if (atomic_load(&sh->done[c]) < s)
            return 0;
    return 1;
}

#define WAIT_SLICE_MS 100 /* how soon a waiting pull notices its caller left */

static int wait_until(zs_shard_t *sh, int64_t deadline_ms)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t left = deadline_ms - zs_now_ms();
    if (left <= 0)
        return -1;
    if (left > WAIT_SLICE_MS)
        left = WAIT_SLICE_MS; /* re-check the caller and the deadline */
    struct timespec ts = now;
    ts.tv_sec += left / 1000;
    ts.tv_nsec += (left % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    return 0;
}

/* Validate a read of [offset, offset+count) (mu held). */
static int begin_read_locked(zs_shard_t *sh, uint64_t offset, uint64_t count, zs_err_t *err)
{
    int rc = zs__shard_require_init(sh, err);
    return rc ? rc : zs__shard_check_range(sh, offset, count, err);
}

static void end_read(zs_shard_t *sh)
{
    pthread_mutex_lock(&sh->mu);
    sh->readers--;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

int zs_shard_pull(zs_shard_t *sh, uint64_t min_step, uint64_t offset, uint64_t count, zs_dtype_t dt,
                  void *dst, int64_t deadline_ms, zs_shard_cancel_fn cancel, void *ud,
                  uint64_t *step, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    if (esz == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown pull dtype %d", (int)dt);
    if (zs__step_check(min_step, "pull of min_step", err))
        return ZS_ERR_INVALID;
    pthread_mutex_lock(&sh->mu);
    int rc;
    for (;;) {
        rc = begin_read_locked(sh, offset, count, err);
        if (rc)
            break;
        uint64_t a = offset - sh->rb, b = a + count;
        if (sh->applied_step >= min_step && chunks_ready(sh, a, b, min_step))
            break;
        if (wait_until(sh, deadline_ms) < 0) {
            rc = zs_err_set(err, ZS_ERR_TIMEOUT,
                            "step %llu not reached before the deadline (server at step %llu)",
                            (unsigned long long)min_step, (unsigned long long)sh->applied_step);
            break;
        }
        if (cancel) { /* asked without mu: it may call into gRPC */
            pthread_mutex_unlock(&sh->mu);
            int gone = cancel(ud);
            pthread_mutex_lock(&sh->mu);
            if (gone) {
                rc = zs_err_set(err, ZS_ERR_CANCELLED, "pull abandoned by the client");
                break;
            }
        }
    }
    if (rc) {
        pthread_mutex_unlock(&sh->mu);
        return rc;
    }
    sh->readers++;
    uint64_t a = offset - sh->rb, b = a + count;
    int nvme = sh->st.nv != NULL;
    pthread_mutex_unlock(&sh->mu);

    /* The NVMe tier: a tile buffer for chunks whose 16-bit copy does not
     * serve (fp32 pulls, or before the first step), within the budget. */
    zs_nvme_buf_t tb = {0};
    int tb_held = 0;
    uint64_t lo = UINT64_MAX;
    char *out = dst;
    for (uint64_t c = a / ZS_OPT_CHUNK; c * ZS_OPT_CHUNK < b; c++) {
        uint64_t s = c * ZS_OPT_CHUNK > a ? c * ZS_OPT_CHUNK : a;
        uint64_t e = (c + 1) * ZS_OPT_CHUNK < b ? (c + 1) * ZS_OPT_CHUNK : b;
        pthread_mutex_lock(&sh->chunk_mu[c]);
        /* A chunk holding an uncommitted (speculative) update: its pre-image
         * is the committed state that done[c] names. */
        const float *pre = zs__spec_committed_master(sh, (size_t)c);
        if (pre)
            zs_cast(out, dt, pre + (s - c * ZS_OPT_CHUNK), ZS_DTYPE_F32, (size_t)(e - s));
        else if (dt != ZS_DTYPE_F32 && sh->lowp_ok[c] == 1 + dt)
            memcpy(out, sh->st.lowp + s, (e - s) * 2);
        else if (!nvme)
            zs_cast(out, dt, sh->st.t[0] + s, ZS_DTYPE_F32, (size_t)(e - s));
        else {
            if (!tb_held) {
                rc = zs_budget_take(&sh->budget, ZS_NVME_SLOT, "a tile buffer for a Pull", err);
                if (!rc && (rc = zs_nvme_buf_alloc(&tb, err)))
                    zs_budget_give(&sh->budget, ZS_NVME_SLOT);
                tb_held = rc == ZS_OK;
            }
            if (!rc)
                rc = zs__nvme_pull_master(sh, (size_t)c, s, e, dt, out, &tb, err);
            if (rc) {
                pthread_mutex_unlock(&sh->chunk_mu[c]);
                break;
            }
        }
        uint64_t d = atomic_load(&sh->done[c]);
        pthread_mutex_unlock(&sh->chunk_mu[c]);
        if (d < lo)
            lo = d;
        out += (e - s) * esz;
    }
    if (tb_held) {
        zs_nvme_buf_free(&tb);
        zs_budget_give(&sh->budget, ZS_NVME_SLOT);
    }
    *step = lo;
    end_read(sh);
    return rc;
}

int zs_shard_get_state(zs_shard_t *sh, zs_tensor_t t, uint64_t offset, uint64_t count, float *dst,
                       uint64_t *step, zs_err_t *err)
{
    if ((unsigned)t > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", (int)t);
    pthread_mutex_lock(&sh->mu);
    int rc = begin_read_locked(sh, offset, count, err);
    /* A consistent view: no optimizer pass in the middle, and the
     * committed state (speculative updates undone). */
    while (!rc && (sh->job_pending || sh->opt_running || sh->spec.running || sh->spec.applied)) {
        if (sh->job_pending || sh->opt_running)
            pthread_cond_wait(&sh->cv, &sh->mu);
        else
            zs__spec_cancel(sh);
        rc = begin_read_locked(sh, offset, count, err);
    }
    if (rc) {
        pthread_mutex_unlock(&sh->mu);
        return rc;
    }
    sh->readers++;
    *step = sh->applied_step;
    if (sh->st.nv) /* buffers within the tier's reservation (zs_shard_create) */
        rc = zs__nvme_get(sh, (int)t, offset - sh->rb, count, dst, err);
    else
        memcpy(dst, sh->st.t[t] + (offset - sh->rb), count * 4);
    pthread_mutex_unlock(&sh->mu);
    end_read(sh);
    return rc;
}

int zs_shard_set_state(zs_shard_t *sh, zs_tensor_t t, uint64_t offset, uint64_t count,
                       const float *src, zs_err_t *err)
{
    if ((unsigned)t > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", (int)t);
    pthread_mutex_lock(&sh->mu);
    int rc = begin_read_locked(sh, offset, count, err);
    if (!rc) {
        zs__shard_wait_idle(sh);
        rc = begin_read_locked(sh, offset, count, err);
    }
    if (!rc) {
        uint64_t a = offset - sh->rb;
        if (sh->st.nv)
            rc = zs__nvme_set(sh, (int)t, a, count, src, err);
        else
            memcpy(sh->st.t[t] + a, src, count * 4);
        if (t == ZS_TENSOR_MASTER)
            for (uint64_t c = a / ZS_OPT_CHUNK; c * ZS_OPT_CHUNK < a + count; c++)
                sh->lowp_ok[c] = 0;
    }
    pthread_mutex_unlock(&sh->mu);
    return rc;
}
