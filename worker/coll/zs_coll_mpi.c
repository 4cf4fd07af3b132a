/*
 * zs_coll_mpi.c - the zs_coll interface (zs_coll.h) on Open MPI, for CPU
 * workers (the CPU device: device buffers are host memory).
 *
 * Streams: every collective is work on the communicator's stream. The
 * zs_coll_* call checks its arguments on the calling thread (a refusal
 * enqueues nothing and leaves the communicator usable), then enqueues a host
 * function (zs_dev_host_fn) that runs the blocking MPI collective on the
 * stream's thread, in order with everything else on that stream. An MPI
 * failure is returned by the host function: it is sticky on the stream
 * (later work there is skipped, `done` events carry it) and zs_coll_sync
 * returns it.
 *
 * Communicator: a private MPI_Comm_dup of MPI_COMM_WORLD, so our traffic
 * never matches the user's receives, with MPI_ERRORS_RETURN set on it: an MPI
 * failure becomes a zs error (ZS_ERR_INTERNAL, "<collective>: MPI <call> at
 * file:line on rank R: <MPI text> (hint: ...)"); the library never aborts or
 * exits. After such an error the collective state of the job is unknown, so
 * the communicator refuses every later collective with ZS_ERR_STATE (at the
 * call, and in host functions already queued); end the job.
 *
 * Threads: MPI is called from the stream's thread (collectives) and from the
 * thread calling create, destroy (no stream work in flight then), so MPI must
 * provide MPI_THREAD_SERIALIZED or higher (checked at create). With
 * SERIALIZED the application must not call MPI itself while work is queued on
 * the communicator's stream (zs_coll_sync first); with MPI_THREAD_MULTIPLE it
 * may. One thread feeds a communicator.
 *
 * Layout (zs_coll.h, NCCL's in place): reduce-scatter reads buf (size *
 * count) and leaves this rank's block of the sum at buf + rank*count;
 * all-gather fills buf (size * count) from every rank's buf + r*count;
 * all-reduce and broadcast work on buf (count). All use MPI_IN_PLACE.
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
 * Counts: MPI counts are int. A collective is split into pieces of at most
 * `max_chunk` elements (default 1 << 30, zs_coll_mpi_set_max_chunk; the value
 * at enqueue time applies), and a single MPI call is used for reduce-scatter
 * and all-gather only while world size * count <= INT_MAX (Open MPI
 * multiplies them in int inside). Pieces, each a blocking MPI call, in the
 * same order on every rank: all-reduce and broadcast cut the buffer into
 * consecutive pieces; all-gather gathers piece j of every rank at once with a
 * resized receive datatype (stride = one rank's block); reduce-scatter
 * becomes one MPI_Reduce per (piece, destination rank), in place at the
 * destination, so the result lands at buf + rank*count directly (the single
 * call, MPI_Reduce_scatter_block in place, leaves it at buf; it is moved).
 * Nothing is refused for size alone except byte sizes that overflow size_t
 * (ZS_ERR_RANGE).
 *
 * Topology (zs_coll_topo.c): at create the world is split into the node's
 * ranks and one local rank across nodes; each split is a communicator of
 * its own (zs_coll_intra, zs_coll_inter) that borrows the world
 * communicator's stream, so its collectives run on the same thread in call
 * order with the world's (MPI stays SERIALIZED).
 *
 * qwZ: q8_pack and q8_unpack run the CPU kernels (kernels/zs_quant.h) as
 * host functions on the stream. qgZ: reduce_scatter_q8 is one host
 * function: pack, MPI_Alltoall on the node's communicator, fp32 sums,
 * pack, MPI_Alltoall across nodes, fp32 sums, one rounding (zs_coll.h).
 *
 * Not done here: non-blocking MPI requests (the stream is the asynchrony),
 * device (GPU) buffers.
 *
 * Lifetime: zs_coll_destroy waits for the queued work (collective: call it on
 * every rank) and frees the stream, the event and the MPI objects; call it
 * before MPI_Finalize (after MPI_Finalize it only frees memory).
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
#include "zs_coll_topo.h"
#include "zs_quant.h"

#define DEFAULT_MAX_CHUNK ((size_t)1 << 30)
#define OP_BLOCK          256 /* elements converted per step inside the user ops */

typedef struct {
    zs_coll_t base; /* first member: zs_coll_t * points here */
    MPI_Comm comm;
    MPI_Datatype t16; /* 2 bytes, contiguous: bf16 and fp16 */
    MPI_Op sum_bf16, max_bf16, sum_f16, max_f16, max_f32;
    size_t max_chunk; /* feeding thread only; copied into each job */
    /* Set (release) by the stream thread after broken_msg is written, read
     * (acquire) by both threads; broken_msg is written once. */
    int broken;
    char broken_msg[ZS_ERR_MSG_MAX];
    int borrowed; /* a sub-communicator: base.stream is the world's */
} coll_mpi_t;

/* What a host function runs: one collective, all arguments checked. */
typedef enum {
    JOB_REDUCE_SCATTER,
    JOB_ALL_GATHER,
    JOB_ALL_REDUCE,
    JOB_BROADCAST,
    JOB_BARRIER
} job_kind_t;

/* The host function's arguments (copied at enqueue, ZS_DEV_MAX_ARGS). */
typedef struct {
    coll_mpi_t *m;
    job_kind_t kind;
    void *buf; /* device (= host) memory, see the layout above */
    size_t count;
    zs_dtype_t dt;
    zs_coll_op_t op; /* all-reduce */
    int root;        /* broadcast */
    size_t max_chunk;
} job_t;

static const char *const JOB_NAME[] = {"reduce_scatter", "all_gather", "all_reduce", "broadcast",
                                       "barrier"};

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
        call += 4; /* "MPI Allreduce at ..." */
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

static int is_broken(coll_mpi_t *m)
{
    return __atomic_load_n(&m->broken, __ATOMIC_ACQUIRE);
}

/* After an MPI failure the job's collective state is unknown: refuse more.
 * Called on the stream thread only. Returns err's code. */
static int mark_broken(coll_mpi_t *m, zs_err_t *err)
{
    if (!is_broken(m)) {
        snprintf(m->broken_msg, sizeof m->broken_msg, "%s", err ? err->msg : "MPI error");
        __atomic_store_n(&m->broken, 1, __ATOMIC_RELEASE);
    }
    return err ? err->code : ZS_ERR_INTERNAL;
}

static int refuse_broken(coll_mpi_t *m, const char *what, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_STATE,
                      "%s: mpi collectives unusable after an earlier MPI error (%s); end the job",
                      what, m->broken_msg);
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

/* ---- argument checks (calling thread) ------------------------------------------ */

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

/* Refuse a job that cannot run: broken communicator, unknown dtype or op,
 * root outside the world, byte size overflowing size_t, NULL buffer with a
 * non-zero count. Nothing is enqueued for a refused job. */
static int job_check(const job_t *j, zs_err_t *err)
{
    coll_mpi_t *m = j->m;
    const char *what = JOB_NAME[j->kind];
    if (is_broken(m))
        return refuse_broken(m, what, err);
    if (j->kind == JOB_BARRIER)
        return ZS_OK;
    if (j->dt != ZS_DTYPE_F32 && j->dt != ZS_DTYPE_BF16 && j->dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dtype %d (%s) is not fp32, bf16 or fp16", what,
                          (int)j->dt, zs_dtype_name(j->dt));
    if (j->kind == JOB_ALL_REDUCE && j->op != ZS_OP_SUM && j->op != ZS_OP_MAX)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: op %d is not ZS_OP_SUM or ZS_OP_MAX", what,
                          (int)j->op);
    if (j->kind == JOB_BROADCAST && (j->root < 0 || j->root >= m->base.size))
        return zs_err_set(err, ZS_ERR_INVALID, "%s: root %d is not a rank of 0..%d", what, j->root,
                          m->base.size - 1);
    int whole = j->kind == JOB_REDUCE_SCATTER || j->kind == JOB_ALL_GATHER;
    size_t bytes;
    int rc = byte_size(j->count, whole ? (size_t)m->base.size : 1, zs_dtype_size(j->dt), &bytes,
                       what, err);
    if (rc)
        return rc;
    if (j->count && !j->buf)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: NULL buffer with count %zu", what, j->count);
    return ZS_OK;
}

/* ---- the collectives (stream thread) ---------------------------------------------- */

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
static size_t piece_limit(const job_t *j, int mult)
{
    size_t lim = (size_t)INT_MAX / (size_t)mult;
    return j->max_chunk < lim ? j->max_chunk : lim;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* In place: the sum of every rank's block r lands at buf + r*count on rank r.
 * One call: MPI_Reduce_scatter_block leaves the block at buf, moved up to
 * buf + rank*count (no overlap for rank >= 1). Pieces: for each piece, one
 * MPI_Reduce per destination d, rooted at d, in place there, so d's result
 * lands at buf + d*count + off directly; non-roots send their block d,
 * which no other reduce writes. */
static int run_reduce_scatter(const job_t *j, zs_err_t *err)
{
    coll_mpi_t *m = j->m;
    int rank = m->base.rank, size = m->base.size;
    size_t es = zs_dtype_size(j->dt), n = j->count;
    char *buf = j->buf;
    MPI_Datatype t = mpi_type(m, j->dt);
    MPI_Op op = mpi_op(m, j->dt, ZS_OP_SUM);
    if (n <= piece_limit(j, size)) {
        int rc = ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Reduce_scatter_block, MPI_IN_PLACE, buf,
                              (int)n, t, op, m->comm);
        if (rc == ZS_OK && rank > 0)
            memmove(buf + (size_t)rank * n * es, buf, n * es);
        return rc;
    }
    size_t chunk = piece_limit(j, 1);
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = min_sz(n - off, chunk);
        for (int d = 0; d < size; d++) {
            char *blk = buf + ((size_t)d * n + off) * es;
            int rc = ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Reduce, d == rank ? MPI_IN_PLACE : blk,
                                  d == rank ? blk : NULL, (int)len, t, op, d, m->comm);
            if (rc)
                return rc;
        }
    }
    return ZS_OK;
}

/* In place: buf + rank*count is this rank's block. Pieces: piece [off,
 * off+len) of every rank at once; the receive type is len elements resized to
 * one rank's block, so block r lands at buf + (r * count + off) elements and
 * MPI_IN_PLACE takes ours from there. */
static int run_all_gather(const job_t *j, zs_err_t *err)
{
    coll_mpi_t *m = j->m;
    int rank = m->base.rank, size = m->base.size;
    size_t es = zs_dtype_size(j->dt), n = j->count;
    char *buf = j->buf;
    MPI_Datatype t = mpi_type(m, j->dt);
    if (n <= piece_limit(j, size))
        return ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Allgather, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                            buf, (int)n, t, m->comm);
    static const char hint_type[] = "out of MPI datatype resources?";
    size_t chunk = piece_limit(j, 1);
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = min_sz(n - off, chunk);
        MPI_Datatype piece, strided;
        int rc = ZS_MPI_CHECK(err, rank, hint_type, MPI_Type_contiguous, (int)len, t, &piece);
        if (rc)
            return rc;
        rc = ZS_MPI_CHECK(err, rank, hint_type, MPI_Type_create_resized, piece, 0,
                          (MPI_Aint)(n * es), &strided);
        MPI_Type_free(&piece);
        if (rc)
            return rc;
        rc = ZS_MPI_CHECK(err, rank, hint_type, MPI_Type_commit, &strided);
        if (rc == ZS_OK)
            rc = ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Allgather, MPI_IN_PLACE, 0,
                              MPI_DATATYPE_NULL, buf + off * es, 1, strided, m->comm);
        MPI_Type_free(&strided);
        if (rc)
            return rc;
    }
    return ZS_OK;
}

/* All-reduce (in place) or broadcast of buf, in consecutive pieces. */
static int run_flat(const job_t *j, zs_err_t *err)
{
    coll_mpi_t *m = j->m;
    size_t es = zs_dtype_size(j->dt), n = j->count, chunk = piece_limit(j, 1);
    char *buf = j->buf;
    MPI_Datatype t = mpi_type(m, j->dt);
    MPI_Op op = mpi_op(m, j->dt, j->op);
    for (size_t off = 0; off < n; off += chunk) {
        int len = (int)min_sz(n - off, chunk), rc;
        if (j->kind == JOB_ALL_REDUCE)
            rc = ZS_MPI_CHECK(err, m->base.rank, HINT_COLL, MPI_Allreduce, MPI_IN_PLACE,
                              buf + off * es, len, t, op, m->comm);
        else
            rc = ZS_MPI_CHECK(err, m->base.rank, HINT_COLL, MPI_Bcast, buf + off * es, len, t,
                              j->root, m->comm);
        if (rc)
            return rc;
    }
    return ZS_OK;
}

/* The host function: run one checked job on the stream thread. A count of 0
 * makes no MPI call (every rank has the same count). An MPI failure breaks
 * the communicator and is returned (sticky on the stream). */
static int run_job(void *args, zs_err_t *err)
{
    const job_t *j = args;
    coll_mpi_t *m = j->m;
    const char *what = JOB_NAME[j->kind];
    zs_err_t own;
    if (!err)
        err = &own;   /* keep the message for mark_broken */
    if (is_broken(m)) /* broken by a job queued before this one */
        return refuse_broken(m, what, err);
    int rc = ZS_OK;
    switch (j->kind) {
    case JOB_REDUCE_SCATTER:
        rc = j->count ? run_reduce_scatter(j, err) : ZS_OK;
        break;
    case JOB_ALL_GATHER:
        rc = j->count ? run_all_gather(j, err) : ZS_OK;
        break;
    case JOB_ALL_REDUCE:
    case JOB_BROADCAST:
        rc = run_flat(j, err);
        break;
    case JOB_BARRIER:
        rc = ZS_MPI_CHECK(err, m->base.rank, HINT_COLL, MPI_Barrier, m->comm);
        break;
    }
    if (rc) {
        zs_err_prefix(err, "%s: ", what);
        mark_broken(m, err);
    }
    return rc;
}

/* Check j on the calling thread, then enqueue it on the communicator's
 * stream. */
static int job_enqueue(const job_t *j, zs_err_t *err)
{
    int rc = job_check(j, err);
    if (rc)
        return rc;
    /* One rank: every in-place collective leaves buf as it is (MPI would
     * copy 2x the bytes for nothing: 1 GB per step at 124M fp32). */
    if (j->m->base.size == 1 && j->kind != JOB_BARRIER)
        return ZS_OK;
    rc = zs_dev_host_fn(j->m->base.stream, run_job, j, sizeof *j, err);
    if (rc)
        zs_err_prefix(err, "%s: ", JOB_NAME[j->kind]);
    return rc;
}

/* ---- the vtable ---------------------------------------------------------------- */

static int mpi_reduce_scatter(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    job_t j = {.m = m,
               .kind = JOB_REDUCE_SCATTER,
               .buf = buf,
               .count = count,
               .dt = dt,
               .max_chunk = m->max_chunk};
    return job_enqueue(&j, err);
}

static int mpi_all_gather(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    job_t j = {.m = m,
               .kind = JOB_ALL_GATHER,
               .buf = buf,
               .count = count,
               .dt = dt,
               .max_chunk = m->max_chunk};
    return job_enqueue(&j, err);
}

static int mpi_all_reduce(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, zs_coll_op_t op,
                          zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    job_t j = {.m = m,
               .kind = JOB_ALL_REDUCE,
               .buf = buf,
               .count = count,
               .dt = dt,
               .op = op,
               .max_chunk = m->max_chunk};
    return job_enqueue(&j, err);
}

static int mpi_broadcast(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, int root,
                         zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    job_t j = {.m = m,
               .kind = JOB_BROADCAST,
               .buf = buf,
               .count = count,
               .dt = dt,
               .root = root,
               .max_chunk = m->max_chunk};
    return job_enqueue(&j, err);
}

static int mpi_barrier(zs_coll_t *c, zs_err_t *err)
{
    job_t j = {.m = (coll_mpi_t *)c, .kind = JOB_BARRIER, .dt = ZS_DTYPE_F32};
    return job_enqueue(&j, err);
}

/* Frees the MPI objects (unless MPI is finalized), then memory. */
static void free_mpi(coll_mpi_t *m)
{
    int finalized = 1;
    MPI_Finalized(&finalized);
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

/* Destroying the stream waits for its queued collectives (every rank must
 * get here); only then is MPI called from this thread. */
static void mpi_destroy(zs_coll_t *c)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    if (c->stream && !m->borrowed)
        zs_dev_stream_destroy(c->stream); /* waits for the subs' work too */
    if (c->after_ev)
        zs_dev_event_destroy(c->after_ev);
    zs_coll_t *sub[4] = {c->intra, c->inter, c->shard, c->replica};
    for (int j = 0; j < 4; j++)
        if (sub[j])
            mpi_destroy(sub[j]);
    free_mpi(m);
}

/* ---- qwZ's kernels as host functions ---------------------------------------- */

typedef struct {
    void *a;       /* pack: the record; unpack: dst */
    const void *b; /* pack: src; unpack: the records */
    zs_dtype_t dt;
    size_t n, nrec; /* nrec 0: pack */
} q8_job_t;

static int run_q8(void *args, zs_err_t *err)
{
    const q8_job_t *j = args;
    if (j->nrec == 0)
        zs_quant_pack(j->a, j->b, j->dt, j->n);
    else
        zs_quant_unpack(j->a, j->dt, j->b, j->n, j->nrec);
    (void)err;
    return ZS_OK;
}

static int mpi_q8_pack(zs_coll_t *c, void *rec, const void *src, zs_dtype_t dt, size_t n,
                       zs_err_t *err)
{
    q8_job_t j = {rec, src, dt, n, 0};
    return zs_dev_host_fn(c->stream, run_q8, &j, sizeof j, err);
}

static int mpi_q8_unpack(zs_coll_t *c, void *dst, zs_dtype_t dt, const void *rec, size_t n,
                         size_t nrec, zs_err_t *err)
{
    q8_job_t j = {dst, rec, dt, n, nrec};
    return nrec ? zs_dev_host_fn(c->stream, run_q8, &j, sizeof j, err) : ZS_OK;
}

/* ---- qgZ: the two-hop quantized reduce-scatter (zs_coll.h) -------------------- */

typedef struct {
    coll_mpi_t *m;
    char *buf, *work;
    size_t count;
    zs_dtype_t dt;
} rsq8_job_t;

/* The stream thread's part: L ranks per node, N nodes, this rank l on node
 * `node`; work = send1 [L][N] records | recv1 [L][N] | acc [N][count] fp32
 * | send2 [N] | recv2 [N]. Block b of buf belongs to rank b = m*L + j. */
static int run_rsq8(void *args, zs_err_t *err)
{
    const rsq8_job_t *j = args;
    coll_mpi_t *m = j->m;
    zs_err_t own;
    if (!err)
        err = &own;
    if (is_broken(m))
        return refuse_broken(m, "reduce_scatter_q8", err);
    const zs_coll_topo_t *t = &m->base.topo;
    size_t L = (size_t)t->local_size, N = (size_t)t->nnodes, l = (size_t)t->local_rank;
    size_t n = j->count, es = zs_dtype_size(j->dt), rb = zs_quant_record_bytes(n);
    size_t W = (size_t)m->base.size;
    char *send1 = j->work, *recv1 = send1 + W * rb;
    float *acc = (float *)(recv1 + W * rb);
    char *send2 = (char *)(acc + N * n), *recv2 = send2 + N * rb;
    int rank = m->base.rank, rc = ZS_OK;
    if (N * rb > INT_MAX)
        return zs_err_set(err, ZS_ERR_RANGE, "reduce_scatter_q8: %zu records of %zu bytes", N, rb);
    if (L > 1) { /* hop 1: to local rank i, the blocks of rank mm*L + i, mm = 0..N-1 */
        for (size_t i = 0; i < L; i++)
            for (size_t mm = 0; mm < N; mm++)
                zs_quant_pack(send1 + (i * N + mm) * rb, j->buf + (mm * L + i) * n * es, j->dt, n);
        rc = ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Alltoall, send1, (int)(N * rb), MPI_BYTE, recv1,
                          (int)(N * rb), MPI_BYTE, ((coll_mpi_t *)m->base.intra)->comm);
        memset(acc, 0, N * n * sizeof *acc);
        for (size_t i = 0; !rc && i < L; i++) /* sources in local-rank order */
            for (size_t mm = 0; mm < N; mm++)
                zs_quant_unpack_add(acc + mm * n, recv1 + (i * N + mm) * rb, n);
    } else { /* one rank per node: its own blocks, exact */
        for (size_t mm = 0; mm < N; mm++)
            zs_cast(acc + mm * n, ZS_DTYPE_F32, j->buf + mm * n * es, j->dt, n);
    }
    float *sum = acc;   /* N == 1: acc[0] is block (0, l), this rank's */
    if (!rc && N > 1) { /* hop 2: partial sum of node mm's block to node mm */
        for (size_t mm = 0; mm < N; mm++)
            zs_quant_pack(send2 + mm * rb, acc + mm * n, ZS_DTYPE_F32, n);
        rc = ZS_MPI_CHECK(err, rank, HINT_COLL, MPI_Alltoall, send2, (int)rb, MPI_BYTE, recv2,
                          (int)rb, MPI_BYTE, ((coll_mpi_t *)m->base.inter)->comm);
        memset(sum, 0, n * sizeof *sum);
        for (size_t k = 0; !rc && k < N; k++) /* nodes in order */
            zs_quant_unpack_add(sum, recv2 + k * rb, n);
    }
    (void)l;
    if (!rc)
        zs_cast(j->buf + (size_t)rank * n * es, j->dt, sum, ZS_DTYPE_F32, n);
    if (rc) {
        zs_err_prefix(err, "reduce_scatter_q8: ");
        mark_broken(m, err);
    }
    return rc;
}

static int mpi_reduce_scatter_q8(zs_coll_t *c, void *buf, size_t count, zs_dtype_t dt, void *work,
                                 zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    if (is_broken(m))
        return refuse_broken(m, "reduce_scatter_q8", err);
    if (!c->intra || !c->inter)
        return zs_err_set(err, ZS_ERR_INVALID, "reduce_scatter_q8: not a world communicator");
    rsq8_job_t j = {m, buf, work, count, dt};
    return zs_dev_host_fn(c->stream, run_rsq8, &j, sizeof j, err);
}

static int mpi_split(zs_coll_t *c, int color, int key, int scope, zs_coll_t **out, zs_err_t *err);

static const zs_coll_vtable_t mpi_vt = {
    .name = "mpi",
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
    .q8_pack = mpi_q8_pack,
    .q8_unpack = mpi_q8_unpack,
    .reduce_scatter_q8 = mpi_reduce_scatter_q8,
    .split = mpi_split,
};

/* ---- construction ------------------------------------------------------------ */

/* MPI initialised, not finalised, at MPI_THREAD_SERIALIZED or higher. */
static int check_mpi_state(zs_err_t *err)
{
    int inited = 0, finalized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zs_err_set(err, ZS_ERR_STATE,
                          "zs_coll_mpi_create: MPI is %s (hint: call "
                          "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...) first)",
                          finalized ? "already finalized" : "not initialised");
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
        return zs_err_set(err, ZS_ERR_STATE,
                          "zs_coll_mpi_create: MPI provides thread level %s, but collectives "
                          "run on the communicator's stream thread and need "
                          "MPI_THREAD_SERIALIZED (hint: initialise with MPI_Init_thread(..., "
                          "MPI_THREAD_SERIALIZED, &provided) and check provided)",
                          level == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED");
    return ZS_OK;
}

/* Dup `from` with MPI_ERRORS_RETURN, create the 16-bit datatype and the
 * reduction ops. Collective over `from`. */
static int setup_mpi(coll_mpi_t *m, MPI_Comm from, zs_err_t *err)
{
    int wrank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    static const char hint_init[] = "is MPI initialised and not finalised on every rank?";
    int rc = ZS_MPI_CHECK(err, wrank, hint_init, MPI_Comm_dup, from, &m->comm);
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
    return rc;
}

/* A sub-communicator over `from` (freed here) on m's stream. */
static int make_sub(coll_mpi_t *m, MPI_Comm from, int scope, zs_coll_t **out, zs_err_t *err)
{
    coll_mpi_t *s = calloc(1, sizeof *s);
    if (!s) {
        MPI_Comm_free(&from);
        return zs_err_set(err, ZS_ERR_NOMEM, "no memory");
    }
    s->base.vt = &mpi_vt;
    s->base.dev = m->base.dev;
    s->base.stream = m->base.stream;
    s->base.scope = scope;
    s->borrowed = 1;
    s->comm = MPI_COMM_NULL;
    s->t16 = MPI_DATATYPE_NULL;
    s->sum_bf16 = s->max_bf16 = s->sum_f16 = s->max_f16 = s->max_f32 = MPI_OP_NULL;
    s->max_chunk = DEFAULT_MAX_CHUNK;
    int rc = setup_mpi(s, from, err);
    MPI_Comm_free(&from);
    if (!rc)
        rc = zs_dev_event_create(s->base.dev, &s->base.after_ev, err);
    if (rc) {
        mpi_destroy(&s->base);
        return rc;
    }
    s->base.topo = m->base.topo;
    MPI_Comm_set_name(s->comm, scope == 1   ? "zeroshard-intra"
                               : scope == 2 ? "zeroshard-inter"
                                            : "zeroshard-mics");
    *out = &s->base;
    return ZS_OK;
}

/* MiCS's groups (zs_coll_vtable_t.split): an MPI split of the world's
 * communicator, from the caller's thread (zs_coll_mics waited for the
 * stream), made a sub-communicator on the world's stream. */
static int mpi_split(zs_coll_t *c, int color, int key, int scope, zs_coll_t **out, zs_err_t *err)
{
    coll_mpi_t *m = (coll_mpi_t *)c;
    if (is_broken(m))
        return refuse_broken(m, "split", err);
    MPI_Comm g = MPI_COMM_NULL;
    int rc = ZS_MPI_CHECK(err, c->rank, HINT_COLL, MPI_Comm_split, m->comm, color, key, &g);
    return rc ? rc : make_sub(m, g, scope, out, err);
}

/* The topology and the intra-node and inter-node communicators, once per
 * job. Collective over m->comm. */
static int make_subs(coll_mpi_t *m, zs_err_t *err)
{
    MPI_Comm intra, inter;
    int rc = zs__coll_topo_build(m->comm, &m->base.topo, &intra, &inter, err);
    if (rc)
        return rc;
    rc = make_sub(m, intra, 1, &m->base.intra, err);
    if (rc) {
        MPI_Comm_free(&inter);
        return rc;
    }
    return make_sub(m, inter, 2, &m->base.inter, err);
}

/* Communicator over MPI_COMM_WORLD on the CPU device `dev`: checks MPI's
 * state and thread level, sets up the MPI objects, then creates the
 * high-priority "comm" stream and the `after` event on dev. Collective over
 * MPI_COMM_WORLD. *out is freed with zs_coll_destroy; dev is not owned. */
int zs_coll_mpi_create(zs_dev_t *dev, zs_coll_t **out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_coll_mpi_create: out is NULL");
    *out = NULL;
    if (!dev)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_coll_mpi_create: dev is NULL");
    if (strcmp(dev->vt->name, "cpu") != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_coll_mpi_create: device %s is not the CPU device (MPI collectives "
                          "read device buffers as host memory; use NCCL on GPUs)",
                          dev->desc);
    int rc = check_mpi_state(err);
    if (rc)
        return rc;

    coll_mpi_t *m = calloc(1, sizeof *m);
    if (!m)
        return zs_err_set(err, ZS_ERR_NOMEM, "zs_coll_mpi_create: no memory");
    m->base.vt = &mpi_vt;
    m->base.dev = dev;
    m->comm = MPI_COMM_NULL;
    m->t16 = MPI_DATATYPE_NULL;
    m->sum_bf16 = m->max_bf16 = m->sum_f16 = m->max_f16 = m->max_f32 = MPI_OP_NULL;
    m->max_chunk = DEFAULT_MAX_CHUNK;

    rc = setup_mpi(m, MPI_COMM_WORLD, err);
    if (!rc)
        rc = zs_dev_stream_create(dev, 1, "comm", &m->base.stream, err);
    if (!rc)
        rc = zs_dev_event_create(dev, &m->base.after_ev, err);
    if (!rc)
        rc = make_subs(m, err);
    if (rc) {
        zs_err_prefix(err, "zs_coll_mpi_create: ");
        mpi_destroy(&m->base);
        return rc;
    }
    *out = &m->base;
    return ZS_OK;
}

/* Set the largest number of elements one MPI call carries (default 1 << 30;
 * accepted 1 .. 1 << 30) for collectives enqueued from now on (queued ones
 * keep theirs). Must be the same value on every rank. Smaller values exercise
 * the split paths in tests. */
int zs_coll_mpi_set_max_chunk(zs_coll_t *c, size_t elems, zs_err_t *err)
{
    if (!c || c->vt != &mpi_vt)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_coll_mpi_set_max_chunk: not an MPI communicator");
    if (elems == 0 || elems > DEFAULT_MAX_CHUNK)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_coll_mpi_set_max_chunk: %zu elements is outside 1 .. %zu", elems,
                          DEFAULT_MAX_CHUNK);
    ((coll_mpi_t *)c)->max_chunk = elems;
    return ZS_OK;
}
