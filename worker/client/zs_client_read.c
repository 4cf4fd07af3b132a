/*
 * zs_client_read.c - the client's server-streaming reads into caller
 * memory: Pull (16-bit or fp32 parameters, with zs_client_pull_each's
 * per-chunk reports) and GetState (fp32 state tensors). Each involved
 * server answers its part of the range on its own fan-out thread; every
 * chunk must be the next piece asked for, and the stream must end at the
 * range's end. A Pull whose destination lies in the shared staging goes by
 * reference (zs_client_shm.c), the server writing in place.
 *
 * Not here: the pushes and unary calls (zs_client.c), checkpoints
 * (zs_client_ckpt.c), the operators' transfers (zs_client_xfer.c).
 */
#include <stdlib.h>

#include "zs_client_internal.h"
#include "zs_rpc.h"

#define M(name) "/zeroshard.Shard/" name

/* ---- Pull and GetState (server streaming into caller memory) ---------------- */

int zs__client_recv(zs_ccall_t *call, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **m,
                    zs_frame_t *fr, zs_err_t *err)
{
    grpc_byte_buffer *bb;
    *m = NULL;
    int rc = zs_ccall_recv(call, &bb, err);
    if (rc || !bb)
        return rc;
    rc = zs_frame_parse(bb, desc, m, fr, err);
    grpc_byte_buffer_destroy(bb);
    if (rc)
        *m = NULL;
    return rc;
}

int zs__client_read_end(const zs_client_t *c, int i, zs_ccall_t *call, int rc, uint64_t next,
                        uint64_t b, uint64_t e, zs_err_t *err)
{
    if (!rc && next != e)
        rc = zs_err_set(err, ZS_ERR_INVALID, "%s: stream ended at %llu of [%llu, %llu)", c->addr[i],
                        (unsigned long long)next, (unsigned long long)b, (unsigned long long)e);
    zs_ccall_destroy(call);
    return rc;
}

typedef struct {
    uint64_t min_step, begin, end;
    void *dst;
    zs_dtype_t dt;
    int tensor;                 /* -1: Pull, else GetState of this tensor */
    zs__client_landed_t landed; /* Pull: progress (fn NULL: none) */
    uint64_t *steps;            /* per server: lowest step seen */
    uint64_t *steps_hi;         /* per server: highest step seen */
} read_arg_t;

static int read_one(zs_client_t *c, int i, void *argp, zs_err_t *err)
{
    read_arg_t *a = argp;
    uint64_t b, e;
    if (!zs__client_clip(c, i, a->begin, a->end, &b, &e))
        return ZS_OK;
    int pull = a->tensor < 0;
    zs_dtype_t dt = pull ? a->dt : ZS_DTYPE_F32;
    size_t esz = zs_dtype_size(dt);
    uint64_t at;
    if (pull && zs__client_shm_usable(c, i, (char *)a->dst + (b - a->begin) * esz, (e - b) * esz,
                                      &at)) /* the server writes into the shared staging */
        return zs__client_shm_pull(c, i, a->min_step, b, e, dt, at, &a->landed, &a->steps[i],
                                   &a->steps_hi[i], err);
    zs_ccall_t call;
    int rc = zs_ccall_start(&call, c->ch[i], pull ? M("Pull") : M("GetState"), c->token,
                            c->timeout_ms, c->addr[i], err);
    if (rc)
        return rc;
    if (pull) {
        Zeroshard__PullRequest q = ZEROSHARD__PULL_REQUEST__INIT;
        q.min_step = a->min_step;
        q.offset = b;
        q.count = e - b;
        q.dtype = (Zeroshard__DType)dt;
        rc = zs_ccall_send(&call, zs_msg_build(&q.base), err);
    } else {
        Zeroshard__StateRequest q = ZEROSHARD__STATE_REQUEST__INIT;
        q.tensor = (Zeroshard__Tensor)a->tensor;
        q.offset = b;
        q.count = e - b;
        rc = zs_ccall_send(&call, zs_msg_build(&q.base), err);
    }
    uint64_t next = b, lo = UINT64_MAX, hi = 0;
    while (!rc) {
        ProtobufCMessage *m;
        zs_frame_t fr;
        rc = zs__client_recv(
            &call, pull ? &zeroshard__pull_chunk__descriptor : &zeroshard__state_chunk__descriptor,
            &m, &fr, err);
        if (rc || !m)
            break;
        uint64_t off, cnt, st;
        int mdt;
        if (pull) {
            Zeroshard__PullChunk *p = (Zeroshard__PullChunk *)m;
            off = p->offset, cnt = p->count, st = p->step, mdt = (int)p->dtype;
        } else {
            Zeroshard__StateChunk *p = (Zeroshard__StateChunk *)m;
            off = p->offset, cnt = p->count, st = p->step, mdt = ZS_DTYPE_F32;
        }
        /* Trust nothing: the chunk must be the next piece we asked for. */
        if (off != next || cnt == 0 || cnt > e - off || mdt != (int)dt || fr.pay_len != cnt * esz)
            rc = zs_err_set(err, ZS_ERR_INVALID,
                            "%s: unexpected chunk [%llu, +%llu) %s of %zu bytes (wanted offset "
                            "%llu)",
                            c->addr[i], (unsigned long long)off, (unsigned long long)cnt,
                            zs_dtype_name(mdt), fr.pay_len, (unsigned long long)next);
        else {
            zs_frame_copy(&fr, (char *)a->dst + (off - a->begin) * esz);
            if (a->landed.fn)
                a->landed.fn(a->landed.arg, off, off + cnt);
            next = off + cnt;
            if (st < lo)
                lo = st;
            if (st > hi)
                hi = st;
        }
        protobuf_c_message_free_unpacked(m, NULL);
        zs_frame_deinit(&fr);
    }
    rc = zs__client_read_end(c, i, &call, rc, next, b, e, err);
    a->steps[i] = lo;
    a->steps_hi[i] = hi;
    return rc;
}

/* Read [a->begin, a->end) from its servers; *step_out / *step_hi (may be
 * NULL) get the lowest / highest step any chunk reported. */
static int read_range(zs_client_t *c, read_arg_t *a, uint64_t *step_out, uint64_t *step_hi,
                      zs_err_t *err)
{
    int f, l;
    int rc = zs__client_owners(c, a->begin, a->end, &f, &l, err);
    if (rc)
        return rc;
    a->steps = calloc((size_t)c->n, sizeof *a->steps);
    a->steps_hi = calloc((size_t)c->n, sizeof *a->steps_hi);
    if (!a->steps || !a->steps_hi) {
        free(a->steps);
        free(a->steps_hi);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    rc = zs__client_fan_out(c, f, l, read_one, NULL, a, err);
    if (rc == ZS_OK && step_out) {
        *step_out = UINT64_MAX;
        for (int i = f; i <= l; i++)
            if (a->steps[i] < *step_out)
                *step_out = a->steps[i];
    }
    if (rc == ZS_OK && step_hi) {
        *step_hi = 0;
        for (int i = f; i <= l; i++)
            if (a->steps_hi[i] > *step_hi)
                *step_hi = a->steps_hi[i];
    }
    free(a->steps);
    free(a->steps_hi);
    return rc;
}

int zs_client_pull(zs_client_t *c, uint64_t min_step, uint64_t begin, uint64_t end, void *dst,
                   zs_dtype_t dt, uint64_t *step_out, zs_err_t *err)
{
    if (zs_dtype_size(dt) == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)dt);
    read_arg_t a = {min_step, begin, end, dst, dt, -1, {NULL, NULL}, NULL, NULL};
    return read_range(c, &a, step_out, NULL, err);
}

int zs_client_pull_each(zs_client_t *c, uint64_t min_step, uint64_t begin, uint64_t end, void *dst,
                        zs_dtype_t dt, zs_client_landed_fn landed, void *arg, zs_err_t *err)
{
    if (zs_dtype_size(dt) == 0)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown dtype %d", (int)dt);
    read_arg_t a = {min_step, begin, end, dst, dt, -1, {landed, arg}, NULL, NULL};
    return read_range(c, &a, NULL, NULL, err);
}

int zs_client_get_state(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, float *dst,
                        zs_err_t *err)
{
    if (tensor < 0 || tensor > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", tensor);
    read_arg_t a = {0, begin, end, dst, ZS_DTYPE_F32, tensor, {NULL, NULL}, NULL, NULL};
    return read_range(c, &a, NULL, NULL, err);
}

int zs_client_get_state_step(zs_client_t *c, int tensor, uint64_t begin, uint64_t end, float *dst,
                             uint64_t *step_lo, uint64_t *step_hi, zs_err_t *err)
{
    if (tensor < 0 || tensor > 2)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown tensor %d", tensor);
    read_arg_t a = {0, begin, end, dst, ZS_DTYPE_F32, tensor, {NULL, NULL}, NULL, NULL};
    return read_range(c, &a, step_lo, step_hi, err);
}
