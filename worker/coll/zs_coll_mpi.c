/*
 * zs_coll_mpi.c - the zs_coll interface (zs_coll.h) on Open MPI, for CPU
 * workers.
 *
 * Communicator: a private MPI_Comm_dup of MPI_COMM_WORLD, so our traffic
 * never matches the user's receives, with MPI_ERRORS_RETURN set on it: an MPI
 * failure becomes a zs error (ZS_ERR_INTERNAL, "MPI <call> at file:line on
 * rank R: <MPI text> (hint: ...)"); the library never aborts or exits. After
 * such an error the collective state of the job is unknown, so the
 * communicator refuses every later call with ZS_ERR_STATE; end the job.
 *
 * Threads: MPI is entered only from the thread that calls these functions.
 * zs_coll_mpi_create requires MPI_THREAD_FUNNELED or higher from
 * MPI_Init_thread; with FUNNELED that thread must be the main thread (checked
 * at create), with SERIALIZED any one thread at a time. A communicator is not
 * thread-safe: one thread uses it. Other threads (gRPC, CPU Adam) may run but
 * must not call MPI.
 *
 * Datatypes and ops: fp32 travels as MPI_FLOAT and sums with MPI_SUM. bf16
 * and fp16 travel as a 2-byte contiguous datatype and reduce with
 * user-defined commutative ops: SUM converts both operands to fp32, adds, and
 * rounds back to nearest even (zs_cast), one rounding per pairwise step. MAX
 * (every dtype, user-defined) is symmetric and exact: a NaN in either operand
 * gives the canonical quiet NaN (so an overflow marker survives any order), +0
 * beats -0, otherwise the larger operand. A SUM whose result is NaN is also
 * made canonical for bf16/fp16, so every pairwise step is commutative bit for
 * bit and every rank of an all-reduce ends with identical bits (fp32 uses the
 * built-in MPI_SUM, whose NaN payload may depend on operand order). The
 * reduction order is Open MPI's and fixed for a given world size, count and
 * piece size, so results are deterministic run to run.
 *
 * Non-blocking: MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Iallreduce,
 * MPI_Ibcast. A request is one slot of a fixed pool of ZS_COLL_MAX_INFLIGHT
 * per communicator (ZS_ERR_BUSY when all are taken); zs_coll_wait waits for
 * every MPI request of the slot and frees it. Requests may be waited in any
 * order; Open MPI advances all outstanding collectives whenever the process
 * is inside MPI (there is no progress thread). Blocking calls start the same
 * operation on a private request and wait for it; they do not use the pool.
 * As MPI requires, every rank must start the same collectives in the same
 * order with the same counts, dtypes, ops and roots.
 *
 * Counts: MPI counts are int. A collective is split into pieces of at most
 * `max_chunk` elements (default 1 << 30, zs_coll_mpi_set_max_chunk), and a
 * single MPI call is used for reduce-scatter and all-gather only while
 * world size * count <= INT_MAX (Open MPI multiplies them in int inside).
 * Pieces: all-reduce and broadcast cut the buffer into consecutive pieces;
 * all-gather gathers piece j of every rank at once with a resized receive
 * datatype (stride = one rank's block); reduce-scatter becomes one
 * MPI_Ireduce per (piece, destination rank). Nothing is refused for size
 * alone except byte sizes that overflow size_t (ZS_ERR_RANGE) or more than
 * INT_MAX pieces. Every piece is its own MPI request and Open MPI's progress
 * cost grows with the number outstanding, so keep pieces large (the default
 * splits only buffers above 1 << 30 elements).
 *
 * In place: all-reduce with send == recv uses MPI_IN_PLACE; all-gather with
 * send == recv + rank * sendcount uses MPI_IN_PLACE; reduce-scatter never
 * (send and recv must not overlap). Any other overlap of send and recv is
 * refused with ZS_ERR_INVALID before any MPI call.
 *
 * Lifetime: zs_coll_destroy waits for requests still in flight (collective:
 * call it on every rank) and frees the MPI objects; call it before
 * MPI_Finalize (after MPI_Finalize it only frees memory).
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "zs_cast.h"
#include "zs_coll.h"

#define DEFAULT_MAX_CHUNK ((size_t)1 << 30)
#define OP_BLOCK          256 /* elements converted per step inside the user ops */

/* One zs_coll request: the MPI requests of all pieces of one collective. */
struct zs_coll_req {
    int in_use;
    const char *what; /* "all_reduce", ... for messages */
    size_t n;         /* MPI requests started */
    MPI_Request one;  /* storage when there is one piece */
    MPI_Request *reqs;
};

typedef struct {
    zs_coll_t base; /* first member: zs_coll_t * points here */
    MPI_Comm comm;
    MPI_Datatype t16; /* 2 bytes, contiguous: bf16 and fp16 */
    MPI_Op sum_bf16, max_bf16, sum_f16, max_f16, max_f32;
    size_t max_chunk;
    int broken;
    char broken_msg[ZS_ERR_MSG_MAX];
    struct zs_coll_req pool[ZS_COLL_MAX_INFLIGHT];
} coll_mpi_t;

/* ---- errors --------------------------------------------------------------- */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Turn an MPI return code into ZS_OK or a ZS_ERR_INTERNAL record naming the
 * call, the place, the rank, MPI's own text and a hint. */
static int mpi_check(int mrc, const char *call, const char *file, int line, int rank,
                     const char *hint, zs_err_t *err)
{
    if (mrc == MPI_SUCCESS)
        return ZS_OK;
    if (strncmp(call, "MPI_", 4) == 0)
        call += 4; /* "MPI Iallreduce at ..." */
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, text, &len) != MPI_SUCCESS || len <= 0)
        snprintf(text, sizeof text, "MPI error code %d", mrc);
    return zs_err_set(err, ZS_ERR_INTERNAL, "MPI %s at %s:%d on rank %d: %s (hint: %s)", call,
                      base_name(file), line, rank, text, hint);
}

/* ZS_MPI_CHECK(err, rank, hint, MPI_Fn, args...): call MPI_Fn(args...) and
 * evaluate to ZS_OK or ZS_ERR_INTERNAL with err filled (see mpi_check). */
#define ZS_MPI_CHECK(err, rank, hint, fn, ...)                                                     \
    mpi_check(fn(__VA_ARGS__), #fn, __FILE__, __LINE__, (rank), (hint), (err))

#define HINT_COLL                                                                                  \
    "every rank must start the same collectives in the same order with the same counts, "          \
    "dtypes, ops and roots"

/* After an MPI failure the job's collective state is unknown: refuse more. */
static int mark_broken(coll_mpi_t *m, zs_err_t *err)
{
    m->broken = 1;
    snprintf(m->broken_msg, sizeof m->broken_msg, "%s", err ? err->msg : "MPI error");
    return err ? err->code : ZS_ERR_INTERNAL;
}

static int refuse_broken(coll_mpi_t *m, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_STATE,
                      "mpi collectives unusable after an earlier MPI error (%s); end the job",
                      m->broken_msg);
}

/* ---- user-defined reduction ops -------------------------------------------- */

static const float CANON_NAN = __builtin_nanf("");

/* Exact, symmetric max: NaN wins (canonical), +0 beats -0. */
static float max_f32(float x, float y)
{
    if (isnan(x) || isnan(y))
        return CANON_NAN;
    if (x > y)
        return x;
    if (y > x)
        return y;
    return (signbit(x) && signbit(y)) ? x : fabsf(x); /* equal: +0 unless both -0 */
}

/* inout[i] = in[i] op inout[i] over n 16-bit values of dtype dt, in fp32. */
static void op16(const uint16_t *in, uint16_t *inout, size_t n, zs_dtype_t dt, int is_max)
{
    float a[OP_BLOCK], b[OP_BLOCK];
    for (size_t i = 0; i < n; i += OP_BLOCK) {
        size_t k = n - i < OP_BLOCK ? n - i : OP_BLOCK;
        zs_cast(a, ZS_DTYPE_F32, in + i, dt, k);
        zs_cast(b, ZS_DTYPE_F32, inout + i, dt, k);
        if (is_max) {
            for (size_t j = 0; j < k; j++)
                a[j] = max_f32(a[j], b[j]);
        } else {
            for (size_t j = 0; j < k; j++) {
                float s = a[j] + b[j];
                a[j] = isnan(s) ? CANON_NAN : s;
            }
        }
        zs_cast(inout + i, dt, a, ZS_DTYPE_F32, k);
    }
}

static void op_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    op16(in, inout, (size_t)*len, ZS_DTYPE_BF16, 0);
}

static void op_max_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    op16(in, inout, (size_t)*len, ZS_DTYPE_BF16, 1);
}

static void op_sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    op16(in, inout, (size_t)*len, ZS_DTYPE_F16, 0);
}

static void op_max_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    op16(in, inout, (size_t)*len, ZS_DTYPE_F16, 1);
}

static void op_max_f32(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const float *x = in;
    float *y = inout;
    for (int i = 0; i < *len; i++)
        y[i] = max_f32(x[i], y[i]);
}

/* ---- argument checks ------------------------------------------------------- */

static int check_dtype(zs_dtype_t dt, const char *what, zs_err_t *err)
{
    if (dt != ZS_DTYPE_F32 && dt != ZS_DTYPE_BF16 && dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dtype %d (%s) is not fp32, bf16 or fp16", what,
                          (int)dt, zs_dtype_name(dt));
    return ZS_OK;
}

/* *bytes = n * mult * esize, refusing size_t overflow. */
static int byte_size(size_t n, size_t mult, size_t esize, size_t *bytes, const char *what,
                     zs_err_t *err)
{
    if (n != 0 && (mult > SIZE_MAX / n || n * mult > SIZE_MAX / esize))
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%s: %zu elements x %zu x %zu bytes overflows the address space", what, n,
                          mult, esize);
    *bytes = n * mult * esize;
    return ZS_OK;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static MPI_Datatype mpi_type(const coll_mpi_t *m, zs_dtype_t dt)
{
    return dt == ZS_DTYPE_F32 ? MPI_FLOAT : m->t16;
}

static MPI_Op mpi_op(const coll_mpi_t *m, zs_dtype_t dt, zs_coll_op_t op)
{
    switch (dt) {
    case ZS_DTYPE_F32:
        return op == ZS_OP_SUM ? MPI_SUM : m->max_f32;
    case ZS_DTYPE_BF16:
        return op == ZS_OP_SUM ? m->sum_bf16 : m->max_bf16;
    default:
        return op == ZS_OP_SUM ? m->sum_f16 : m->max_f16;
    }
}

/* Largest element count one MPI call may carry when Open MPI multiplies it by
 * `mult` (the world size for reduce-scatter/all-gather, else 1) in int. */
static size_t piece_limit(const coll_mpi_t *m, int mult)
{
    size_t lim = (size_t)INT_MAX / (size_t)mult;
    return m->max_chunk < lim ? m->max_chunk : lim;
}

static size_t div_up(size_t a, size_t b)
{
    return a / b + (a % b != 0);
}

/* ---- requests ------------------------------------------------------------- */

/* Prepare r for n MPI requests (n may be 0: an empty collective). */
static int req_init(struct zs_coll_req *r, size_t n, const char *what, zs_err_t *err)
{
    r->what = what;
    r->n = 0;
    r->reqs = &r->one;
    if (n > (size_t)INT_MAX)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%s: %zu MPI pieces are too many; raise the piece size "
                          "(zs_coll_mpi_set_max_chunk)",
                          what, n);
    if (n > 1) {
        r->reqs = malloc(n * sizeof *r->reqs);
        if (!r->reqs) {
            r->reqs = &r->one;
            return zs_err_set(err, ZS_ERR_NOMEM, "%s: no memory for %zu MPI requests", what, n);
        }
    }
    return ZS_OK;
}

static void req_release(struct zs_coll_req *r)
{
    if (r->reqs != &r->one)
        free(r->reqs);
    r->reqs = &r->one;
    r->n = 0;
    r->in_use = 0;
}

/* Wait for every MPI request of r, then release it. */
static int req_finish(coll_mpi_t *m, struct zs_coll_req *r, zs_err_t *err)
{
    int rc = ZS_OK;
    if (r->n > 0)
        rc = ZS_MPI_CHECK(err, m->base.rank, HINT_COLL, MPI_Waitall, (int)r->n, r->reqs,
                          MPI_STATUSES_IGNORE);
    if (rc != ZS_OK) {
        zs_err_prefix(err, "%s: ", r->what);
        mark_broken(m, err);
    }
    req_release(r);
    return rc;
}

/* A start failed after `r->n` pieces were started: those cannot be cancelled
 * (MPI forbids it for collectives), so the communicator is done. */
static int start_failed(coll_mpi_t *m, struct zs_coll_req *r, zs_err_t *err)
{
    zs_err_prefix(err, "%s: ", r->what);
    mark_broken(m, err);
    req_release(r); /* leaks the MPI requests already started, by necessity */
    return err ? err->code : ZS_ERR_INTERNAL;
}

/* Pick where a collective's MPI requests go: a pool slot (non-blocking) or
 * the caller's stack request (blocking). */
static int req_acquire(coll_mpi_t *m, zs_coll_req_t **req, struct zs_coll_req *local,
                       struct zs_coll_req **out, const char *what, zs_err_t *err)
{
    if (!req) {
        memset(local, 0, sizeof *local);
        local->in_use = 1;
        *out = local;
        return ZS_OK;
    }
    for (int i = 0; i < ZS_COLL_MAX_INFLIGHT; i++) {
        if (!m->pool[i].in_use) {
            m->pool[i].in_use = 1;
            *out = &m->pool[i];
            return ZS_OK;
        }
    }
    return zs_err_set(err, ZS_ERR_BUSY,
                      "%s: all %d request slots are in flight; zs_coll_wait some before "
                      "starting more",
                      what, ZS_COLL_MAX_INFLIGHT);
}

/* Blocking: wait now. Non-blocking: hand the slot to the caller. */
static int req_done_starting(coll_mpi_t *m, struct zs_coll_req *r, zs_coll_req_t **req,
                             zs_err_t *err)
{
    if (!req)
        return req_finish(m, r, err);
    *req = r;
    return ZS_OK;
}

/* The refusals every collective starts with: a broken communicator, an
 * unknown dtype. */
static int coll_begin(coll_mpi_t *m, zs_dtype_t dt, const char *what, zs_err_t *err)
{
    if (m->broken)
        return refuse_broken(m, err);
    return check_dtype(dt, what, err);
}

/* req_acquire + req_init for nreq MPI requests; on failure nothing is held. */
static int req_start(coll_mpi_t *m, zs_coll_req_t **req, struct zs_coll_req *local,
                     struct zs_coll_req **r, size_t nreq, const char *what, zs_err_t *err)
{
    int rc = req_acquire(m, req, local, r, what, err);
    if (rc)
        return rc;
    if ((rc = req_init(*r, nreq, what, err)))
        req_release(*r);
    return rc;
}

/* ---- collectives ------------------------------------------------------------ */

static int mpi_reduce_scatter(zs_coll_t *c, const void *send, void *recv, size_t recvcount,
                              zs_dtype_t dt, zs_coll_req_t **req, zs_err_t *err)
{
    static const char what[] = "reduce_scatter";
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own; /* keep the message for mark_broken */
    int rc = coll_begin(m, dt, what, err);
    if (rc)
        return rc;
    size_t es = zs_dtype_size(dt), sbytes = 0, rbytes;
    if ((rc = byte_size(recvcount, (size_t)c->size, es, &sbytes, what, err)))
        return rc;
    rbytes = recvcount * es;
    if (recvcount && (!send || !recv))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer with recvcount %zu", what,
                          recvcount);
    if (recvcount && send == recv)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: send == recv is not allowed (no in-place)",
                          what);
    if (overlaps(send, sbytes, recv, rbytes))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: send and recv buffers overlap", what);

    size_t single = piece_limit(m, c->size), chunk = piece_limit(m, 1);
    int one_call = recvcount <= single;
    size_t pieces = recvcount == 0 ? 0 : one_call ? 1 : div_up(recvcount, chunk);
    size_t nreq = one_call ? pieces : pieces * (size_t)c->size;
    if (!one_call && pieces > (size_t)INT_MAX / (size_t)c->size)
        nreq = (size_t)INT_MAX + 1; /* refused by req_init */

    struct zs_coll_req local, *r;
    if ((rc = req_start(m, req, &local, &r, nreq, what, err)))
        return rc;
    MPI_Datatype t = mpi_type(m, dt);
    MPI_Op op = mpi_op(m, dt, ZS_OP_SUM);
    if (one_call && pieces) {
        rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Ireduce_scatter_block, send, recv,
                          (int)recvcount, t, op, m->comm, &r->reqs[0]);
        if (rc)
            return start_failed(m, r, err);
        r->n = 1;
    } else if (pieces) {
        /* Piece j of destination rank d: reduce its elements to d. */
        const char *s = send;
        char *o = recv;
        for (size_t off = 0; off < recvcount; off += chunk) {
            size_t len = recvcount - off < chunk ? recvcount - off : chunk;
            for (int d = 0; d < c->size; d++) {
                const char *src = s + ((size_t)d * recvcount + off) * es;
                rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Ireduce, src,
                                  d == c->rank ? o + off * es : NULL, (int)len, t, op, d, m->comm,
                                  &r->reqs[r->n]);
                if (rc)
                    return start_failed(m, r, err);
                r->n++;
            }
        }
    }
    return req_done_starting(m, r, req, err);
}

static int mpi_all_gather(zs_coll_t *c, const void *send, void *recv, size_t sendcount,
                          zs_dtype_t dt, zs_coll_req_t **req, zs_err_t *err)
{
    static const char what[] = "all_gather";
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own; /* keep the message for mark_broken */
    int rc = coll_begin(m, dt, what, err);
    if (rc)
        return rc;
    size_t es = zs_dtype_size(dt), rbytes = 0, sbytes;
    if ((rc = byte_size(sendcount, (size_t)c->size, es, &rbytes, what, err)))
        return rc;
    sbytes = sendcount * es;
    if (sendcount && (!send || !recv))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer with sendcount %zu", what,
                          sendcount);
    int in_place = sendcount && (const char *)send == (char *)recv + (size_t)c->rank * sbytes;
    if (!in_place && overlaps(send, sbytes, recv, rbytes))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "%s: send overlaps recv but is not recv + rank * sendcount (in place)",
                          what);

    size_t single = piece_limit(m, c->size), chunk = piece_limit(m, 1);
    int one_call = sendcount <= single;
    size_t pieces = sendcount == 0 ? 0 : one_call ? 1 : div_up(sendcount, chunk);

    struct zs_coll_req local, *r;
    if ((rc = req_start(m, req, &local, &r, pieces, what, err)))
        return rc;
    MPI_Datatype t = mpi_type(m, dt);
    if (one_call && pieces) {
        rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Iallgather, in_place ? MPI_IN_PLACE : send,
                          (int)sendcount, t, recv, (int)sendcount, t, m->comm, &r->reqs[0]);
        if (rc)
            return start_failed(m, r, err);
        r->n = 1;
    } else if (pieces) {
        /* Piece [off, off+len) of every rank at once: the receive type is len
         * elements resized to one rank's block, so block r lands at
         * recv + (r * sendcount + off) elements. */
        for (size_t off = 0; off < sendcount; off += chunk) {
            size_t len = sendcount - off < chunk ? sendcount - off : chunk;
            MPI_Datatype piece, strided;
            rc = ZS_MPI_CHECK(err, c->rank, "out of MPI datatype resources?", MPI_Type_contiguous,
                              (int)len, t, &piece);
            if (rc)
                return start_failed(m, r, err);
            rc = ZS_MPI_CHECK(err, c->rank, "out of MPI datatype resources?",
                              MPI_Type_create_resized, piece, 0, (MPI_Aint)sbytes, &strided);
            MPI_Type_free(&piece);
            if (rc)
                return start_failed(m, r, err);
            rc = ZS_MPI_CHECK(err, c->rank, "out of MPI datatype resources?", MPI_Type_commit,
                              &strided);
            if (rc == ZS_OK)
                rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Iallgather,
                                  in_place ? MPI_IN_PLACE : (const char *)send + off * es, (int)len,
                                  t, (char *)recv + off * es, 1, strided, m->comm, &r->reqs[r->n]);
            MPI_Type_free(&strided); /* pending operations keep their own reference */
            if (rc)
                return start_failed(m, r, err);
            r->n++;
        }
    }
    return req_done_starting(m, r, req, err);
}

static int mpi_all_reduce(zs_coll_t *c, const void *send, void *recv, size_t count, zs_dtype_t dt,
                          zs_coll_op_t op, zs_coll_req_t **req, zs_err_t *err)
{
    static const char what[] = "all_reduce";
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own; /* keep the message for mark_broken */
    int rc = coll_begin(m, dt, what, err);
    if (rc)
        return rc;
    if (op != ZS_OP_SUM && op != ZS_OP_MAX)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: op %d is not ZS_OP_SUM or ZS_OP_MAX", what,
                          (int)op);
    size_t es = zs_dtype_size(dt), bytes = 0;
    if ((rc = byte_size(count, 1, es, &bytes, what, err)))
        return rc;
    if (count && (!send || !recv))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer with count %zu", what, count);
    int in_place = count && send == recv;
    if (!in_place && overlaps(send, bytes, recv, bytes))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "%s: send and recv overlap without being equal (in place)", what);

    size_t chunk = piece_limit(m, 1);
    size_t pieces = div_up(count, chunk);
    struct zs_coll_req local, *r;
    if ((rc = req_start(m, req, &local, &r, pieces, what, err)))
        return rc;
    MPI_Datatype t = mpi_type(m, dt);
    MPI_Op mop = mpi_op(m, dt, op);
    for (size_t off = 0; off < count; off += chunk) {
        size_t len = count - off < chunk ? count - off : chunk;
        rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Iallreduce,
                          in_place ? MPI_IN_PLACE : (const char *)send + off * es,
                          (char *)recv + off * es, (int)len, t, mop, m->comm, &r->reqs[r->n]);
        if (rc)
            return start_failed(m, r, err);
        r->n++;
    }
    return req_done_starting(m, r, req, err);
}

static int mpi_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                         zs_coll_req_t **req, zs_err_t *err)
{
    static const char what[] = "broadcast";
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own; /* keep the message for mark_broken */
    int rc = coll_begin(m, dt, what, err);
    if (rc)
        return rc;
    if (root < 0 || root >= c->size)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: root %d is not a rank of 0..%d", what, root,
                          c->size - 1);
    size_t es = zs_dtype_size(dt), bytes = 0;
    if ((rc = byte_size(count, 1, es, &bytes, what, err)))
        return rc;
    if (count && !buf)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer with count %zu", what, count);

    size_t chunk = piece_limit(m, 1);
    size_t pieces = div_up(count, chunk);
    struct zs_coll_req local, *r;
    if ((rc = req_start(m, req, &local, &r, pieces, what, err)))
        return rc;
    MPI_Datatype t = mpi_type(m, dt);
    for (size_t off = 0; off < count; off += chunk) {
        size_t len = count - off < chunk ? count - off : chunk;
        rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Ibcast, (char *)buf + off * es, (int)len, t,
                          root, m->comm, &r->reqs[r->n]);
        if (rc)
            return start_failed(m, r, err);
        r->n++;
    }
    return req_done_starting(m, r, req, err);
}

static int mpi_barrier(zs_coll_t *c, zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own; /* keep the message for mark_broken */
    if (m->broken)
        return refuse_broken(m, err);
    int rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Barrier, m->comm);
    if (rc) {
        zs_err_prefix(err, "barrier: ");
        mark_broken(m, err);
    }
    return rc;
}

static int mpi_wait(zs_coll_t *c, zs_coll_req_t *req, zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    zs_err_t own;
    if (!err)
        err = &own;
    if (!req)
        return zs_err_set(err, ZS_ERR_INVALID, "wait: NULL request");
    uintptr_t p = (uintptr_t)req, first = (uintptr_t)m->pool;
    if (p < first || p >= first + sizeof m->pool || (p - first) % sizeof m->pool[0])
        return zs_err_set(err, ZS_ERR_INVALID, "wait: request %p is not from this communicator",
                          (void *)req);
    if (!req->in_use)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "wait: request %p is not in flight (already waited?)", (void *)req);
    if (m->broken) {
        req_release(req);
        return refuse_broken(m, err);
    }
    return req_finish(m, req, err);
}

static void mpi_destroy(zs_coll_t *c)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    int finalized = 1;
    MPI_Finalized(&finalized);
    for (int i = 0; i < ZS_COLL_MAX_INFLIGHT; i++) {
        struct zs_coll_req *r = &m->pool[i];
        if (!r->in_use)
            continue;
        if (!finalized && !m->broken && r->n > 0)
            MPI_Waitall((int)r->n, r->reqs, MPI_STATUSES_IGNORE);
        req_release(r);
    }
    if (!finalized) {
        MPI_Op *ops[] = {&m->sum_bf16, &m->max_bf16, &m->sum_f16, &m->max_f16, &m->max_f32};
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (*ops[i] != MPI_OP_NULL)
                MPI_Op_free(ops[i]);
        if (m->t16 != MPI_DATATYPE_NULL)
            MPI_Type_free(&m->t16);
        if (m->comm != MPI_COMM_NULL)
            MPI_Comm_free(&m->comm);
    }
    free(m);
}

static const zs_coll_vtable_t mpi_vt = {
    .name = "mpi",
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .wait = mpi_wait,
    .destroy = mpi_destroy,
};

/* ---- construction ------------------------------------------------------------ */

/* Communicator over MPI_COMM_WORLD: checks MPI's state and thread level, dups
 * the world communicator, sets MPI_ERRORS_RETURN on the dup and creates the
 * 16-bit datatype and the reduction ops. Collective over MPI_COMM_WORLD. */
int zs_coll_mpi_create(zs_coll_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_coll_mpi_create: out is NULL");
    *out = NULL;
    int inited = 0, finalized = 0, level = MPI_THREAD_SINGLE, is_main = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zs_err_set(err, ZS_ERR_STATE,
                          "zs_coll_mpi_create: MPI is %s (hint: call "
                          "MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...) first)",
                          finalized ? "already finalized" : "not initialised");
    MPI_Query_thread(&level);
    MPI_Is_thread_main(&is_main);
    if (level < MPI_THREAD_FUNNELED)
        return zs_err_set(err, ZS_ERR_STATE,
                          "zs_coll_mpi_create: MPI provides thread level %d (SINGLE); zeroshard "
                          "has other threads and needs MPI_THREAD_FUNNELED (hint: initialise "
                          "with MPI_Init_thread(..., MPI_THREAD_FUNNELED, &provided))",
                          level);
    if (level == MPI_THREAD_FUNNELED && !is_main)
        return zs_err_set(err, ZS_ERR_STATE,
                          "zs_coll_mpi_create: called from a thread other than the one that "
                          "initialised MPI, but MPI only provides MPI_THREAD_FUNNELED");

    coll_mpi_t *m = calloc(1, sizeof *m);
    if (!m)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_coll_mpi_create: no memory");
    m->base.vt = &mpi_vt;
    m->comm = MPI_COMM_NULL;
    m->t16 = MPI_DATATYPE_NULL;
    m->sum_bf16 = m->max_bf16 = m->sum_f16 = m->max_f16 = m->max_f32 = MPI_OP_NULL;
    m->max_chunk = DEFAULT_MAX_CHUNK;
    for (int i = 0; i < ZS_COLL_MAX_INFLIGHT; i++)
        m->pool[i].reqs = &m->pool[i].one;
    int wrank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);

    static const char hint_init[] = "is MPI initialised and not finalised on every rank?";
    int rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Comm_dup, MPI_COMM_WORLD, &m->comm);
    if (!rc)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Comm_set_errhandler, m->comm,
                          MPI_ERRORS_RETURN);
    if (!rc)
        MPI_Comm_set_name(m->comm, "zeroshard");
    if (!rc)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Comm_rank, m->comm, &m->base.rank);
    if (!rc)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Comm_size, m->comm, &m->base.size);
    if (!rc)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Type_contiguous, 2, MPI_BYTE, &m->t16);
    if (!rc)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Type_commit, &m->t16);
    struct {
        MPI_User_function *fn;
        MPI_Op *op;
    } ops[] = {{op_sum_bf16, &m->sum_bf16},
               {op_max_bf16, &m->max_bf16},
               {op_sum_f16, &m->sum_f16},
               {op_max_f16, &m->max_f16},
               {op_max_f32, &m->max_f32}};
    for (size_t i = 0; !rc && i < sizeof ops / sizeof ops[0]; i++)
        rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Op_create, ops[i].fn, 1, ops[i].op);
    if (rc) {
        zs_err_prefix(err, "zs_coll_mpi_create: ");
        mpi_destroy(&m->base);
        return rc;
    }
    *out = &m->base;
    return ZS_OK;
}

/* Set the largest number of elements one MPI call carries (default 1 << 30;
 * accepted 1 .. 1 << 30). Must be set to the same value on every rank, with
 * no request in flight. Smaller values exercise the split paths in tests. */
int zs_coll_mpi_set_max_chunk(zs_coll_t *c, size_t elems, zs_err_t *err)
{
    if (!c || c->vt != &mpi_vt)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_coll_mpi_set_max_chunk: not an MPI communicator");
    if (elems == 0 || elems > DEFAULT_MAX_CHUNK)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_coll_mpi_set_max_chunk: %zu elements is outside 1 .. %zu", elems,
                          DEFAULT_MAX_CHUNK);
    coll_mpi_t *m = (coll_mpi_t *)c;
    for (int i = 0; i < ZS_COLL_MAX_INFLIGHT; i++)
        if (m->pool[i].in_use)
            return zs_err_set(err, ZS_ERR_STATE,
                              "zs_coll_mpi_set_max_chunk: requests are in flight; wait first");
    m->max_chunk = elems;
    return ZS_OK;
}
