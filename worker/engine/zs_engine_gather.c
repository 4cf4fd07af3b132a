/*
 * zs_engine_gather.c - stage 3 parameter fetching, per layer (DeepSpeed's
 * module granularity; a stage-3 segment is one layer).
 *
 * A gather copies this worker's partition of the segment (device memory,
 * or pinned host memory with offload_param: then it is a host-to-device
 * copy) into its block of a gather buffer, all-gathers the buffer in place
 * on the communication stream (with zero_quantized_weights, qwZ: as int8
 * blocks with fp32 scales through the engine's one record buffer, every
 * block, this worker's too, dequantized, so every worker computes with the
 * same values; the partition itself, the optimizer's and the servers'
 * state are never quantized), casts it to the fp32 view the layers read
 * (16-bit dtypes), and records the segment's event; the compute stream
 * waits on that event before the layer runs.
 *
 * Budgets (elements, DeepSpeed's keys):
 *   stage3_prefetch_bucket_size  gathered ahead of use and not used yet
 *   stage3_max_live_parameters   a layer is kept after use (instead of
 *                                freed) only while the gathered total stays
 *                                within it
 *   stage3_max_reuse_distance    ... and only if its next use comes within
 *                                this many parameters of other layers' compute
 *   stage3_param_persistence_threshold  layers this small stay gathered
 * The layers a use needs are always gathered, so the gathered total stays
 * within max_live + prefetch + the largest need of one layer (need_max).
 * Freed gather buffers are kept for reuse by exact size (layers repeat:
 * every block of a GPT has the same size) and count as held; the cache is
 * trimmed to the same bound. A buffer is reused only after the event of its
 * last use on the compute stream.
 */
#include <stdlib.h>
#include <string.h>

#include "zs_engine_internal.h"

static size_t gather_bytes(const zs_engine_t *e, const zs__seg_t *s)
{
    return (size_t)s->n_pad * e->esz + (size_t)(s->n * zs__eng_view_esz(e));
}

/* Bound on non-persistent gathered bytes (live + cached). */
static uint64_t bound_bytes(const zs_engine_t *e)
{
    uint64_t elems = (uint64_t)e->cfg.stage3_max_live_parameters +
                     (uint64_t)e->cfg.stage3_prefetch_bucket_size + e->need_max;
    return elems * (e->esz + zs__eng_view_esz(e));
}

static uint64_t cached_bytes(const zs_engine_t *e)
{
    uint64_t c = 0;
    for (int i = 0; i < e->ngfree; i++)
        c += e->gfree[i].bytes;
    return c;
}

/* Drop the oldest cached buffer (waits for its last use). */
static void trim_one(zs_engine_t *e)
{
    zs__gfree_t f = e->gfree[0];
    memmove(e->gfree, e->gfree + 1, (size_t)(e->ngfree - 1) * sizeof *e->gfree);
    e->ngfree--;
    zs_dev_event_sync(f.ev, NULL);
    zs_dev_event_destroy(f.ev);
    zs_dev_free(e->dev, f.p);
}

/* A gather buffer of `bytes`: a cached one (the comm stream waits for its
 * last use) or a new allocation. */
static int buf_get(zs_engine_t *e, size_t bytes, void **out, zs_err_t *err)
{
    for (int i = 0; i < e->ngfree; i++)
        if (e->gfree[i].bytes == bytes) {
            zs__gfree_t f = e->gfree[i];
            memmove(e->gfree + i, e->gfree + i + 1, (size_t)(e->ngfree - i - 1) * sizeof *e->gfree);
            e->ngfree--;
            int rc = zs_dev_stream_wait(e->comm, f.ev, err);
            zs_dev_event_destroy(f.ev);
            if (rc) {
                zs_dev_free(e->dev, f.p);
                return rc;
            }
            *out = f.p;
            return ZS_OK;
        }
    uint64_t live = e->live_elems * (e->esz + zs__eng_view_esz(e));
    while (e->ngfree > 0 && live + cached_bytes(e) + bytes > bound_bytes(e))
        trim_one(e);
    return zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_GATHERED, bytes, out, "gathered parameters",
                         err);
}

/* Return a gather buffer; its last use is the compute stream's work so far. */
static int buf_put(zs_engine_t *e, void *p, size_t bytes, zs_err_t *err)
{
    zs_event_t *ev = NULL;
    int rc = zs_dev_event_create(e->dev, &ev, err);
    if (!rc)
        rc = zs_dev_event_record(ev, e->compute, err);
    if (rc) { /* cannot track its last use: wait for everything, then free */
        zs_dev_stream_sync(e->compute, NULL);
        zs_dev_event_destroy(ev);
        zs_dev_free(e->dev, p);
        return rc;
    }
    if (e->ngfree == ZS_GFREE_MAX)
        trim_one(e);
    e->gfree[e->ngfree++] = (zs__gfree_t){p, bytes, ev};
    uint64_t live = e->live_elems * (e->esz + zs__eng_view_esz(e));
    while (e->ngfree > 0 && live + cached_bytes(e) > bound_bytes(e))
        trim_one(e);
    return ZS_OK;
}

/* After a segment's all-gather: its fp32 view (16-bit runs), its event. */
static int gather_done(zs_engine_t *e, zs__seg_t *s, zs_err_t *err)
{
    if (zs__eng_view_esz(e))
        ZS_ENG_TRY(zs_dev_cast(e->comm, s->g32, ZS_DTYPE_F32, s->gbuf, e->dt, s->n, err));
    return zs_dev_event_record(s->gev, e->comm, err);
}

/* hpZ: the segment from the node's secondary partition: this worker's
 * slice (local rank l of L: elements [l*m, (l+1)*m), m = n_pad / L, the
 * values the step's first gather brought, dequantized with qwZ) into its
 * block, all-gathered over the node's communicator. Nothing crosses nodes,
 * and the values are bitwise the first gather's. */
static int gather_in_node(zs_engine_t *e, zs__seg_t *s, zs_err_t *err)
{
    zs_coll_t *in = zs_coll_intra(e->coll);
    uint64_t m = s->n_pad / (uint64_t)e->hpz, l = (uint64_t)in->rank;
    ZS_ENG_TRY(zs_dev_memcpy(e->comm, zs__at(e, s->gbuf, l * m), zs__at(e, e->sec, s->sbase),
                             m * e->esz, err));
    ZS_ENG_TRY(zs_coll_all_gather(in, s->gbuf, m, e->dt, NULL, NULL, err));
    return gather_done(e, s, err);
}

int zs__eng_gather_pc(zs_engine_t *e, zs__seg_t *s, zs_err_t *err)
{
    if (e->qbuf) /* qwZ: int8 records on the wire, dequantized into the gather buffer */
        return zs_coll_all_gather_q8(e->pc, s->gbuf, s->part, e->dt, e->qbuf, NULL, NULL, err);
    if (e->hbuf) /* MiCS over nodes: across nodes, then within the node */
        return zs_coll_all_gather_hier(e->pc, s->gbuf, s->part, e->dt, e->hbuf, NULL, NULL, err);
    return zs_coll_all_gather(e->pc, s->gbuf, s->part, e->dt, NULL, NULL, err);
}

int zs__eng_gather_seg(zs_engine_t *e, int k, zs_err_t *err)
{
    zs__seg_t *s = &e->s[k];
    /* streamed pulls: the last step's parameters of segments up to k first
     * (a resident segment is gathered again there) */
    ZS_ENG_TRY(zs__eng_pull_land(e, k, err));
    if (s->gbuf || s->n == 0)
        return ZS_OK;
    size_t bytes = gather_bytes(e, s);
    ZS_ENG_TRY(buf_get(e, bytes, &s->gbuf, err));
    s->gbytes = bytes;
    s->g32 = e->dt == ZS_DTYPE_F32 ? (float *)s->gbuf
             : e->params16         ? NULL
                                   : (float *)((char *)s->gbuf + (size_t)s->n_pad * e->esz);
    if (!s->persistent)
        e->live_elems += s->n_pad;
    /* The partition is written by the optimizer (compute), by pulled
     * parameters (copy) or by the host (offload_param): wait for both. */
    ZS_ENG_TRY(zs_dev_event_record(e->ev_compute, e->compute, err));
    ZS_ENG_TRY(zs_dev_event_record(e->ev_copy, e->copy, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_compute, err));
    ZS_ENG_TRY(zs_dev_stream_wait(e->comm, e->ev_copy, err));
    if (e->hpz && !s->persistent && s->sec_gen == e->param_gen)
        return gather_in_node(e, s, err);
    if (e->pnv) { /* offload_param nvme: the part from its file (or host region) */
        void *p;
        ZS_ENG_TRY(zs__pnv_begin(e, s, 1, &p, err));
        ZS_ENG_TRY(zs_dev_memcpy(e->comm, zs__at(e, s->gbuf, (uint64_t)e->rank * s->part), p,
                                 s->part * e->esz, err));
        ZS_ENG_TRY(zs__pnv_end(e, s, p, 0, e->comm, err));
    } else {
        ZS_ENG_TRY(zs_dev_memcpy(e->comm, zs__at(e, s->gbuf, (uint64_t)e->rank * s->part),
                                 zs__at(e, e->params, s->qbase), s->part * e->esz, err));
    }
    ZS_ENG_TRY(zs__eng_gather_pc(e, s, err));
    if (e->hpz && !s->persistent) { /* keep this node's slice for the step's later gathers */
        uint64_t m = s->n_pad / (uint64_t)e->hpz, l = (uint64_t)zs_coll_topo(e->coll)->local_rank;
        ZS_ENG_TRY(zs_dev_memcpy(e->comm, zs__at(e, e->sec, s->sbase), zs__at(e, s->gbuf, l * m),
                                 m * e->esz, err));
        s->sec_gen = e->param_gen;
    }
    return gather_done(e, s, err);
}

void zs__eng_drop_seg(zs_engine_t *e, int k)
{
    zs__seg_t *s = &e->s[k];
    if (!s->gbuf)
        return;
    if (!s->persistent)
        e->live_elems -= s->n_pad;
    if (s->prefetched)
        e->prefetch_elems -= s->n_pad;
    s->prefetched = 0;
    buf_put(e, s->gbuf, s->gbytes, NULL);
    s->gbuf = NULL;
    s->g32 = NULL;
}

void zs__eng_gather_free_all(zs_engine_t *e)
{
    for (int k = 0; e->s && k < e->ns; k++) {
        zs__seg_t *s = &e->s[k];
        zs_dev_free(e->dev, s->gbuf);
        s->gbuf = NULL;
        s->g32 = NULL;
    }
    while (e->ngfree > 0)
        trim_one(e);
    e->live_elems = 0;
    e->prefetch_elems = 0;
}

/* Segments layer i reads (its own, then its deps'), without repeats. */
static int layer_segs(const zs_engine_t *e, int i, int *out)
{
    int n = 0;
    out[n++] = e->layer_seg[i];
    for (int d = 0; e->deps[i][d] >= 0; d++) {
        int k = e->layer_seg[e->deps[i][d]], dup = 0;
        for (int j = 0; j < n; j++)
            dup |= out[j] == k;
        if (!dup)
            out[n++] = k;
    }
    return n;
}

static int uses_seg(const zs_engine_t *e, int layer, int k)
{
    if (e->layer_seg[layer] == k)
        return 1;
    for (int d = 0; e->deps[layer][d] >= 0; d++)
        if (e->layer_seg[e->deps[layer][d]] == k)
            return 1;
    return 0;
}

#define PREFETCH_AHEAD 8 /* layers looked ahead for prefetching */

int zs__eng_gather_layer(zs_engine_t *e, int pos, zs_err_t *err)
{
    int segs[64], n;
    if (e->maxdeps + 1 > 64)
        return zs_err_set(err, ZS_ERR_INVALID, "a layer with more than 63 dependencies");
    n = layer_segs(e, e->order[pos], segs);
    for (int j = 0; j < n; j++) {
        zs__seg_t *s = &e->s[segs[j]];
        if (s->n == 0)
            continue;
        ZS_ENG_TRY(zs__eng_gather_seg(e, segs[j], err));
        if (s->prefetched) {
            s->prefetched = 0;
            e->prefetch_elems -= s->n_pad;
        }
        /* (the debug knob drops this wait to prove the tests catch it) */
        if (!(e->debug & ZS_ENGINE_DEBUG_DROP_WAIT))
            ZS_ENG_TRY(zs_dev_stream_wait(e->compute, s->gev, err));
    }
    /* Prefetch the next layers' segments while they fit the budgets. */
    uint64_t budget = (uint64_t)e->cfg.stage3_prefetch_bucket_size;
    uint64_t live_max = (uint64_t)e->cfg.stage3_max_live_parameters;
    int end = 2 * e->nlayers;
    for (int p = pos + 1; p < end && p <= pos + PREFETCH_AHEAD; p++) {
        n = layer_segs(e, e->order[p], segs);
        for (int j = 0; j < n; j++) {
            zs__seg_t *s = &e->s[segs[j]];
            if (s->gbuf || s->n == 0)
                continue;
            if (e->prefetch_elems + s->n_pad > budget || e->live_elems + s->n_pad > live_max)
                return ZS_OK;
            ZS_ENG_TRY(zs__eng_gather_seg(e, segs[j], err));
            s->prefetched = 1;
            e->prefetch_elems += s->n_pad;
        }
    }
    return ZS_OK;
}

int zs__eng_release_layer(zs_engine_t *e, int pos, zs_err_t *err)
{
    int segs[64];
    int n = layer_segs(e, e->order[pos], segs), end = 2 * e->nlayers;
    for (int j = 0; j < n; j++) {
        int k = segs[j];
        zs__seg_t *s = &e->s[k];
        if (!s->gbuf || s->persistent)
            continue;
        /* Next use in this micro-batch's passes, and the parameters of the
         * layers computed before it. */
        uint64_t dist = 0;
        int next = -1;
        for (int p = pos + 1; p < end; p++) {
            if (uses_seg(e, e->order[p], k)) {
                next = p;
                break;
            }
            dist += e->m.nparams[e->order[p]];
        }
        int keep = next >= 0 && dist <= (uint64_t)e->cfg.stage3_max_reuse_distance &&
                   e->live_elems <= (uint64_t)e->cfg.stage3_max_live_parameters;
        if (!keep)
            zs__eng_drop_seg(e, k);
    }
    (void)err;
    return ZS_OK;
}
