/*
 * zs_service_shm.c - Push and Pull through a co-located worker's shared
 * staging segment (see zs_service_shm.h; docs/protocol.md, "Shared-memory
 * data plane"). The gRPC message stays the doorbell and carries every field
 * but the payload; a ShmRef says where in the segment's staging area the
 * payload lies (Push) or goes (Pull).
 *
 * Push copies the referenced bytes exactly where a `data` payload would
 * have been copied (zs_shard_push_chunk) and checks the checksum on that
 * private copy (hashed piece by piece as it is copied), never on the
 * shared bytes: the worker can write those at
 * any time, so checking then copying could stage bytes that were not
 * checked. Pull converts straight into the segment, then hashes what it
 * wrote there (a worker that writes the same bytes meanwhile breaks the
 * ownership rule and only fails its own check).
 *
 * Does not: map or end sessions (zs_shm_sessions.c), use the segment's chunk
 * table or PARAM area, or touch GetState/SetState/Initialize (they carry
 * `data` only).
 */
#include "zs_service_shm.h"

#include <stdatomic.h>
#include <string.h>

#include "zs_dtype.h"
#include "zs_hash.h"
#include "zs_service.h"
#include "zs_shm_sessions.h"

/* The sessions handlers look up (zs_service_set_shm); NULL: none offered.
 * Set before serving and cleared after the RPC server stopped. */
static zs_shm_sessions_t *_Atomic g_shm;

void zs_service_set_shm(zs_shm_sessions_t *s)
{
    atomic_store(&g_shm, s);
}

void zs__svc_shm_hello(uint64_t session, char **socket, protobuf_c_boolean *ok,
                       uint32_t *chunk_bytes)
{
    zs_shm_sessions_t *s = atomic_load(&g_shm);
    *socket = s ? (char *)zs_shm_sessions_path(s) : (char *)"";
    *chunk_bytes = s ? ZS_RPC_MAX_SHM_CHUNK_BYTES : 0;
    zs_shm_session_t *ss = zs_shm_sessions_get(s, session);
    *ok = ss != NULL;
    zs_shm_session_put(ss);
}

static int unknown_session(uint64_t id, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_STATE,
                      "unknown shared-memory session %016llx: not handed over on this server's "
                      "shm socket%s, or its worker exited",
                      (unsigned long long)id, atomic_load(&g_shm) ? "" : " (it offers none)");
}

/* [off, off + n) must lie in the staging area of `avail` bytes, off on an
 * element boundary (the converted elements are written typed). */
static int check_ref(const zs_shm_session_t *ss, uint64_t off, uint64_t n, size_t esz,
                     uint64_t avail, zs_err_t *err)
{
    if (off % esz)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "shared-memory byte_offset %llu is not a multiple of the element size "
                          "(%zu bytes)",
                          (unsigned long long)off, esz);
    if (off > avail || n > avail - off)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "shared-memory reference of %llu bytes at byte_offset %llu lies outside "
                          "the %llu-byte staging area of session %016llx",
                          (unsigned long long)n, (unsigned long long)off, (unsigned long long)avail,
                          (unsigned long long)zs_shm_session_id(ss));
    return ZS_OK;
}

int zs__svc_shm_push_check(const Zeroshard__PushChunk *m, size_t pay_len, zs_err_t *err)
{
    if (pay_len)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "PushChunk carries both `data` (%zu bytes) and `shm`: one or the other",
                          pay_len);
    zs_dtype_t dt = (zs_dtype_t)m->dtype;
    size_t esz = zs_dtype_size(dt);
    if (esz == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)m->dtype);
    if (m->count == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "chunk with count 0");
    if (m->count > ZS_RPC_MAX_SHM_CHUNK_BYTES / esz) /* HelloReply.shm_chunk_bytes */
        return zs_err_set(err, ZS_ERR_INVALID,
                          "chunk of %llu %s elements exceeds the %u-byte limit of a shared-memory "
                          "reference",
                          (unsigned long long)m->count, zs_dtype_name(dt),
                          ZS_RPC_MAX_SHM_CHUNK_BYTES);
    return ZS_OK;
}

int zs__svc_shm_push(zs_shard_push_t *ps, const Zeroshard__PushChunk *m, uint64_t *bytes,
                     zs_err_t *err)
{
    const Zeroshard__ShmRef *r = m->shm;
    zs_shm_session_t *ss = zs_shm_sessions_get(atomic_load(&g_shm), r->session);
    if (!ss)
        return unknown_session(r->session, err);
    zs_dtype_t dt = (zs_dtype_t)m->dtype;
    size_t esz = zs_dtype_size(dt);
    size_t n = (size_t)m->count * esz; /* <= 4 MiB: zs__svc_shm_push_check */
    uint64_t avail;
    const unsigned char *stg = zs_shm_session_staging(ss, &avail);
    int rc = check_ref(ss, r->byte_offset, n, esz, avail, err);
    void *dst = NULL;
    if (!rc)
        rc = zs_shard_push_chunk(ps, m->step, m->offset, m->count, dt, &dst, err);
    if (!rc) {
        uint64_t h = r->has_xxh3 ? zs_hash64_copy(dst, stg + r->byte_offset, n, m->step)
                                 : (memcpy(dst, stg + r->byte_offset, n), 0);
        zs_shard_push_chunk_done(ps);
        if (r->has_xxh3 && h != r->xxh3)
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "checksum mismatch: XXH3 of the %zu bytes at shared-memory offset "
                            "%llu (seed: step %llu) is %016llx, the chunk says %016llx",
                            n, (unsigned long long)r->byte_offset, (unsigned long long)m->step,
                            (unsigned long long)h, (unsigned long long)r->xxh3);
    }
    if (!rc) {
        *bytes += n;
        zs_shm_session_count(ss, n, 0);
    }
    zs_shm_session_put(ss);
    return rc;
}

/* zs_shard_cancel_fn of a waiting shm pull: its client or its worker gone? */
typedef struct {
    zs_scall_t *call;
    const zs_shm_session_t *ss;
} pull_wait_t;

static int pull_stop(void *ud)
{
    pull_wait_t *w = ud;
    return zs_scall_cancelled(w->call) || !zs_shm_session_alive(w->ss);
}

static int worker_gone(const zs_shm_session_t *ss, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_UNAVAILABLE,
                      "shared-memory session %016llx ended during the Pull: its worker (pid %d) "
                      "exited",
                      (unsigned long long)zs_shm_session_id(ss), (int)zs_shm_session_pid(ss));
}

int zs__svc_shm_pull(zs_shard_t *sh, zs_scall_t *call, const zs__shm_pull_t *p, zs_err_t *err)
{
    zs_shm_session_t *ss = zs_shm_sessions_get(atomic_load(&g_shm), p->ref.session);
    if (!ss)
        return unknown_session(p->ref.session, err);
    size_t esz = zs_dtype_size(p->dtype);
    uint64_t avail;
    unsigned char *stg = zs_shm_session_staging(ss, &avail);
    /* count is inside the server's range (<= 2^44): count * esz cannot wrap. */
    int rc = check_ref(ss, p->ref.byte_offset, p->count * esz, esz, avail, err);
    uint64_t per = p->chunk_bytes / esz, sent = 0;
    pull_wait_t w = {call, ss};
    while (!rc && sent < p->count) {
        uint64_t k = p->count - sent < per ? p->count - sent : per;
        uint64_t at = p->ref.byte_offset + sent * esz;
        Zeroshard__PullChunk m = ZEROSHARD__PULL_CHUNK__INIT;
        Zeroshard__ShmRef r = ZEROSHARD__SHM_REF__INIT;
        rc = zs_shard_pull(sh, p->min_step, p->offset + sent, k, p->dtype, stg + at, p->deadline_ms,
                           pull_stop, &w, &m.step, err);
        if (!zs_shm_session_alive(ss)) /* cancelled by it, or gone as the copy ended */
            rc = worker_gone(ss, err);
        if (rc)
            break;
        r.session = p->ref.session;
        r.byte_offset = at;
        r.has_xxh3 = p->ref.has_xxh3;
        if (r.has_xxh3)
            r.xxh3 = zs_hash64(stg + at, (size_t)(k * esz), m.step);
        m.offset = p->offset + sent;
        m.count = k;
        m.dtype = (Zeroshard__DType)p->dtype;
        m.shm = &r;
        rc = zs_scall_send(call, zs_msg_build(&m.base), err);
        if (!rc)
            sent += k;
    }
    zs_shard_count_bytes(sh, 0, sent * esz);
    zs_shm_session_count(ss, 0, sent * esz);
    zs_shm_session_put(ss);
    if (!rc)
        rc = zs_scall_finish(call, NULL, ZS_OK, "");
    return rc;
}
