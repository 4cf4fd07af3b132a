/*
 * zs_engine.c - engine layout and lifecycle: segments and buckets (see
 * zs_engine_internal.h), model state and working buffers on the device,
 * per-layer fp32 views of 16-bit parameters (no fp32 copy of the model),
 * initial parameters, destroy. The step is in zs_engine_step.c and
 * zs_engine_optim.c, stage-3 fetching in zs_engine_gather.c, memory in
 * zs_engine_mem.c, servers in zs_engine_ckpt.c.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_engine_internal.h"
#include "zs_log.h"
#include "zs_quant.h"

double zs__eng_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

int zs__eng_alloc(zs_engine_t *e, int space, int cat, size_t bytes, void **out, const char *what,
                  zs_err_t *err)
{
    int rc = zs_dev_alloc(e->dev, space, cat, bytes, out, err);
    if (rc)
        return zs_err_set(err, rc, "out of %s memory for %s (%zu bytes): %s", zs_space_name(space),
                          what, bytes, err->msg);
    return ZS_OK;
}

int zs__eng_agree(zs_engine_t *e, int rc, zs_err_t *err)
{
    float f = rc ? 1.0f : 0.0f;
    zs_err_t tmp;
    int r2 = zs_coll_all_reduce_host(e->coll, &f, 1, ZS_DTYPE_F32, ZS_OP_MAX, rc ? &tmp : err);
    if (rc)
        return rc;
    if (r2)
        return r2;
    return f > 0 ? zs_err_set(err, ZS_ERR_INTERNAL, "another worker failed (see its log)") : ZS_OK;
}

void *zs__eng_grad_part(zs_engine_t *e, const zs__seg_t *s)
{
    return e->stage < 2 ? zs__at(e, e->grads, s->pbase + s->vb) : zs__at(e, e->grads, s->qbase);
}

void *zs__eng_param_part(zs_engine_t *e, const zs__seg_t *s)
{
    return e->stage < 3 ? zs__at(e, e->params, s->pbase + s->vb) : zs__at(e, e->params, s->qbase);
}

/* See zs_engine_internal.h. */
int zs__eng_pull_in_place(const zs_engine_t *e)
{
    return !e->shm_staging && !e->pnv &&
           ((e->stage == 3 && e->offload_param) || e->dev->host_addressable);
}

/* See zs_engine_internal.h. */
int zs__eng_pull_quiesce(zs_engine_t *e, zs_err_t *err)
{
    if (!zs__eng_pull_in_place(e))
        return ZS_OK;
    ZS_ENG_TRY(zs_dev_stream_sync(e->compute, err));
    ZS_ENG_TRY(zs_dev_stream_sync(e->comm, err));
    return zs_dev_stream_sync(e->copy, err);
}

/* Pointer to layer i's own params where the layers read them in place:
 * fp32 params, 16-bit params with params16 (both in e->dt), stage-3
 * gathered buffers (their fp32 views without params16); else NULL (stages
 * 0-2 in 16-bit without params16: cast per use). */
static void *resident_params(zs_engine_t *e, int layer)
{
    zs__seg_t *s = &e->s[e->layer_seg[layer]];
    uint64_t rel = e->layer_off[layer] - s->off;
    if (e->stage == 3) {
        if (e->params16)
            return s->gbuf ? zs__at(e, s->gbuf, rel) : NULL;
        return s->g32 ? s->g32 + rel : NULL;
    }
    if (e->dt == ZS_DTYPE_F32 || e->params16)
        return zs__at(e, e->params, s->pbase + rel);
    return NULL;
}

int zs__eng_layer_ptrs(zs_engine_t *e, int layer, void **ptrs, zs_err_t *err)
{
    if (e->stage == 3 || e->dt == ZS_DTYPE_F32 || e->params16) {
        ptrs[0] = resident_params(e, layer);
        for (int d = 0; e->deps[layer][d] >= 0; d++)
            ptrs[1 + d] = resident_params(e, e->deps[layer][d]);
        return ZS_OK;
    }
    /* 16-bit stages 0-2: the layer's params, then each dep's, cast into
     * e->view (view_max fp32 elements) on the compute stream. The previous
     * layer's work was enqueued on the same stream, so it has read the view
     * before the cast overwrites it. */
    uint64_t at = 0;
    for (int d = -1; d < 0 || e->deps[layer][d] >= 0; d++) {
        int l = d < 0 ? layer : e->deps[layer][d];
        zs__seg_t *s = &e->s[e->layer_seg[l]];
        uint64_t n = e->m.nparams[l];
        ptrs[1 + d] = e->view + at;
        if (n)
            ZS_ENG_TRY(zs_dev_cast(e->compute, e->view + at, ZS_DTYPE_F32,
                                   zs__at(e, e->params, s->pbase + (e->layer_off[l] - s->off)),
                                   e->dt, n, err));
        at += n;
    }
    return ZS_OK;
}

static uint64_t round_up(uint64_t n, uint64_t m)
{
    return (n + m - 1) / m * m;
}

/* Segments: stages 0-2 whole consecutive layers up to `cap` elements (a
 * segment is then also a bucket); stage 3 one per layer, buckets grouping
 * consecutive layers up to `cap`. */
static int make_layout(zs_engine_t *e, uint64_t cap, zs_err_t *err)
{
    e->s = calloc((size_t)e->nlayers, sizeof *e->s);
    e->b = calloc((size_t)e->nlayers, sizeof *e->b);
    if (!e->s || !e->b)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int ns = 0;
    uint64_t off = 0;
    for (int i = 0; i < e->nlayers; i++) {
        uint64_t np = e->m.nparams[i];
        if (ns == 0 || e->stage == 3 || (e->s[ns - 1].n > 0 && e->s[ns - 1].n + np > cap)) {
            e->s[ns].first = i;
            e->s[ns].off = off;
            ns++;
        }
        zs__seg_t *s = &e->s[ns - 1];
        s->last = i;
        s->n += np;
        e->layer_off[i] = off;
        e->layer_seg[i] = ns - 1;
        off += np;
    }
    e->ns = ns;
    e->P = off;
    uint64_t pbase = 0, W = (uint64_t)e->W;
    for (int k = 0; k < ns; k++) {
        zs__seg_t *s = &e->s[k];
        s->n_pad = round_up(s->n, W * ZS_SEG_ALIGN);
        s->part = s->n_pad / W;
        s->pbase = pbase;
        s->qbase = pbase / W;
        s->sbase = e->hpz ? pbase / (uint64_t)e->hpz : 0;
        pbase += s->n_pad;
        uint64_t a = (uint64_t)e->rank * s->part, z = a + s->part;
        s->vb = a < s->n ? a : s->n;
        s->ve = z < s->n ? z : s->n;
        s->persistent = e->stage == 3 && (int64_t)s->n <= e->cfg.stage3_param_persistence_threshold;
        if (s->n_pad > e->max_seg_pad)
            e->max_seg_pad = s->n_pad;
    }
    e->Ppad = pbase;
    /* Buckets over segments. */
    int nb = 0;
    for (int k = 0; k < ns; k++) {
        zs__seg_t *s = &e->s[k];
        zs__bucket_t *b = nb ? &e->b[nb - 1] : NULL;
        if (!b || e->stage < 3 || (b->npad > 0 && b->npad + s->n_pad > cap)) {
            b = &e->b[nb++];
            b->s0 = k;
            b->first = s->first;
            b->gbase = s->pbase;
            b->slot = -1;
        }
        b->s1 = k;
        b->last = s->last;
        b->npad += s->n_pad;
        s->bucket = nb - 1;
    }
    e->nb = nb;
    for (int k = 0; k < nb; k++)
        if (e->b[k].npad > e->max_bucket_pad)
            e->max_bucket_pad = e->b[k].npad;
    /* Gradient scratch: the bucket in backward, one reduction in flight
     * (fp32 stages 2-3 only: the slot itself is reduce-scattered on the comm
     * stream; stages 0-1 and 16-bit runs are done with the slot on the
     * compute stream as soon as the bucket is reduced - accumulated, or cast
     * into a reduce buffer - so the next bucket reuses it in stream order),
     * and one per bucket that receives gradients early through a dependency
     * (a tied head writes into the embedding's bucket first). */
    int early = 0;
    for (int k = 0; k < nb; k++) {
        int hit = 0;
        for (int i = 0; i < e->nlayers && !hit; i++)
            for (int d = 0; !e->deps_ro[i] && e->deps[i][d] >= 0; d++) {
                int dl = e->deps[i][d];
                if (e->s[e->layer_seg[dl]].bucket == k && e->s[e->layer_seg[i]].bucket != k)
                    hit = 1;
            }
        e->b[k].early = hit;
        early += hit;
        uint64_t *pad = hit ? &e->early_pad : &e->gen_pad;
        if (e->b[k].npad > *pad)
            *pad = e->b[k].npad;
    }
    int inflight = e->stage >= 2 && e->dt == ZS_DTYPE_F32 ? 1 : 0;
    e->ngen = 1 + inflight < nb - early ? 1 + inflight : nb - early;
    e->ngslot = e->ngen + early;
    /* a second reduce buffer overlaps one bucket's reduction with the next
     * bucket's cast; at W = 1 the reduction is the identity, so one does */
    int want = e->Wd > 1 ? ZS_COMM_SLOTS : 1;
    e->ncslot = want < nb ? want : nb;
    e->gslot = calloc((size_t)e->ngslot, sizeof *e->gslot);
    if (!e->gslot)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < e->ngslot; i++)
        e->gslot[i].owner = -1;
    for (int i = 0; i < ZS_COMM_SLOTS; i++) {
        e->cslot[i].owner = -1;
        e->aslot[i].owner = -1;
    }
    return ZS_OK;
}

/* opts->groups into e (after copy_model: P is known). One learning rate per
 * step: the engine has no per-group schedule, so lr indexes above 0 are
 * refused rather than given lr 0 on the servers. */
static int copy_groups(zs_engine_t *e, const zs_group_range_t *r, size_t n, zs_err_t *err)
{
    int rc = zs_groups_check(r, n, e->P, err);
    if (rc)
        return rc;
    if (zs_groups_nlrs(r, n) > 1)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "parameter groups with lr_index > 0: the engine runs one learning "
                          "rate per step");
    if (n == 0)
        return ZS_OK;
    if (!(e->groups = malloc(n * sizeof *r)))
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %zu parameter group ranges", n);
    memcpy(e->groups, r, n * sizeof *r);
    e->ngroups = n;
    return ZS_OK;
}

static int copy_model(zs_engine_t *e, const zs_model_t *m, zs_err_t *err)
{
    e->m = *m;
    e->nlayers = m->nlayers;
    if (m->nlayers <= 0 || !m->nparams || !m->forward || !m->backward || !m->init_params ||
        !m->load_batch || !m->loss || !m->bind)
        return zs_err_set(err, ZS_ERR_INVALID, "model is incomplete (layers or callbacks missing)");
    e->layer_off = calloc((size_t)m->nlayers, sizeof *e->layer_off);
    e->layer_seg = calloc((size_t)m->nlayers, sizeof *e->layer_seg);
    e->deps = calloc((size_t)m->nlayers, sizeof *e->deps);
    e->deps_ro = calloc((size_t)m->nlayers, 1);
    if (!e->layer_off || !e->layer_seg || !e->deps || !e->deps_ro)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (m->deps_read_only)
        memcpy(e->deps_ro, m->deps_read_only, (size_t)m->nlayers);
    for (int i = 0; i < m->nlayers; i++) {
        int n = 0;
        while (m->deps && m->deps[i] && m->deps[i][n] >= 0)
            n++;
        e->deps[i] = malloc((size_t)(n + 1) * sizeof **e->deps);
        if (!e->deps[i])
            return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        for (int k = 0; k < n; k++) {
            int d = m->deps[i][k];
            if (d < 0 || d >= i)
                return zs_err_set(err, ZS_ERR_INVALID,
                                  "layer %d depends on layer %d: only lower layers allowed", i, d);
            e->deps[i][k] = d;
        }
        e->deps[i][n] = -1;
        if (n > e->maxdeps)
            e->maxdeps = n;
    }
    return ZS_OK;
}

/* Elements in the device's fp32 transfer chunk of init and export (the
 * host side holds a whole segment): 4 MiB, so no buffer of a whole
 * segment (the whole model at stages 0-2 with a large reduce_bucket_size)
 * is on the device. */
static uint64_t xfer_chunk(const zs_engine_t *e)
{
    return e->max_seg_pad < ZS_XFER_CHUNK ? e->max_seg_pad : ZS_XFER_CHUNK;
}

/* Fill the model state from the model's initial parameters, one segment at
 * a time through a host buffer of the largest segment and a device fp32
 * chunk (xfer_chunk elements). Segment-relative ranges: the parameters
 * [0, n) at stages 0-2, else this worker's part [vb, ve); the master
 * weights (in-process optimizer) [0, n) at stage 0, else [vb, ve). */
int zs__eng_init_state(zs_engine_t *e, zs_err_t *err)
{
    uint64_t ch = xfer_chunk(e);
    float *host = NULL, *dev = NULL;
    int rc = zs__eng_alloc(e, ZS_SPACE_HOST, ZS_MEM_SCRATCH, (size_t)e->max_seg_pad * 4,
                           (void **)&host, "initial parameters", err);
    if (!rc)
        rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, (size_t)ch * 4, (void **)&dev,
                           "initial parameters", err);
    for (int k = 0; k < e->ns && !rc; k++) {
        zs__seg_t *s = &e->s[k];
        if (s->n == 0)
            continue;
        for (int i = s->first; i <= s->last && !rc; i++)
            if (e->m.nparams[i])
                rc = e->m.init_params(e->m.self, i, host + (e->layer_off[i] - s->off), err);
        uint64_t lo = e->stage < 3 ? 0 : s->vb, hi = e->stage < 3 ? s->n : s->ve;
        void *part = NULL; /* offload_param nvme: the segment's part, written below */
        if (e->pnv)
            rc = zs__pnv_begin(e, s, 0, &part, err);
        for (uint64_t a = lo; a < hi && !rc; a += ch) {
            uint64_t z = a + ch < hi ? a + ch : hi;
            /* the next chunk's copy into dev follows these reads in stream order */
            rc = zs_dev_memcpy(e->compute, dev, host + a, (z - a) * 4, err);
            if (!rc)
                rc = zs_dev_cast(
                    e->compute,
                    part ? zs__at(e, part, a - s->vb)
                         : zs__at(e, e->params, e->stage < 3 ? s->pbase + a : s->qbase + a - s->vb),
                    e->dt, dev, ZS_DTYPE_F32, z - a, err);
            if (rc || !e->master)
                continue;
            if (e->stage == 0) {
                rc = zs_dev_memcpy(e->compute, e->master + s->pbase + a, dev, (z - a) * 4, err);
                continue;
            }
            uint64_t x0 = a > s->vb ? a : s->vb, x1 = z < s->ve ? z : s->ve;
            if (x1 > x0)
                rc = zs_dev_memcpy(e->compute, e->master + s->qbase + (x0 - s->vb), dev + (x0 - a),
                                   (x1 - x0) * 4, err);
        }
        /* the host buffer is refilled next: wait for the copies out of it */
        if (!rc)
            rc = zs_dev_stream_sync(e->compute, err);
        if (!rc && part)
            rc = zs__pnv_end(e, s, part, 1, NULL, err);
    }
    zs_dev_free(e->dev, host);
    zs_dev_free(e->dev, dev);
    return rc;
}

/* hpZ: zero_hpz_partition_size H > 1 must be the ranks per node L of the
 * collectives' topology (the secondary partition lives within a node and
 * its gathers run on the node's communicator); H = 1 is off. */
static int hpz_setup(zs_engine_t *e, zs_err_t *err)
{
    int64_t h = e->cfg.zero_hpz_partition_size;
    if (h <= 1)
        return ZS_OK;
    const zs_coll_topo_t *t = zs_coll_topo(e->coll);
    if (e->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_hpz_partition_size %lld: hpZ needs stage 3 (stage is %d)",
                          (long long)h, e->stage);
    if (h != t->local_size || !zs_coll_intra(e->coll))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_hpz_partition_size %lld: the secondary partition is kept within "
                          "a node here, so it must be 1 or the ranks per node (%d; "
                          "ZS_RANKS_PER_NODE or MPI's shared-memory view)",
                          (long long)h, t->local_size);
    e->hpz = (int)h;
    return ZS_OK;
}

/* qgZ: the collectives must have the quantized reduce-scatter (MPI, and
 * NCCL through ncclSend/ncclRecv) over a regular topology. */
static int qgz_check(zs_engine_t *e, zs_err_t *err)
{
    if (!e->cfg.zero_quantized_gradients)
        return ZS_OK;
    if (e->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID, "zero_quantized_gradients: qgZ needs stage 3");
    if (!e->coll->vt->reduce_scatter_q8)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_quantized_gradients: the %s collectives have no quantized "
                          "reduce-scatter (qgZ)",
                          e->coll->vt->name);
    if (!zs_coll_topo(e->coll)->regular)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zero_quantized_gradients: qgZ's two hops need nodes of equal size "
                          "with consecutive ranks (ZS_RANKS_PER_NODE, or mpirun --map-by node "
                          "placing ranks by node)");
    return ZS_OK;
}

static int alloc_state(zs_engine_t *e, zs_err_t *err)
{
    uint64_t full = e->Ppad, part = e->Ppad / (uint64_t)e->W;
    int pspace = e->stage == 3 && e->offload_param ? ZS_SPACE_PINNED : ZS_SPACE_DEVICE;
    if (e->stage == 3 && e->cfg.offload_param_nvme) /* the partition in a file */
        /* every worker fails if one cannot (nvme_path is per host) */
        ZS_ENG_TRY(zs__eng_agree(e, zs__pnv_create(e, err), err));
    else
        ZS_ENG_TRY(zs__eng_alloc(e, pspace, ZS_MEM_PARAMS, (e->stage < 3 ? full : part) * e->esz,
                                 &e->params, "parameters", err));
    /* With offload at stages 2-3 no gradient partition stays on the device:
     * reduced buckets go to pinned staging (zs_engine_step.c). */
    if (!zs__eng_grads_offloaded(e) || (e->debug & ZS_ENGINE_DEBUG_KEEP_GRADS))
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_GRADS,
                                 (e->stage < 2 ? full : part) * e->esz, &e->grads, "gradients",
                                 err));
    if (e->params)
        ZS_ENG_TRY(
            zs_dev_memset(e->compute, e->params, 0, (e->stage < 3 ? full : part) * e->esz, err));
    /* 16-bit stages 0-2 (a model reading fp32 only): one fp32 view of the
     * largest layer with its deps (no fp32 copy of the whole model). */
    for (int i = 0; i < e->nlayers && !e->params16; i++) {
        uint64_t need = e->m.nparams[i];
        for (int d = 0; e->deps[i][d] >= 0; d++)
            need += e->m.nparams[e->deps[i][d]];
        if (need > e->view_max)
            e->view_max = need;
    }
    if (e->stage < 3 && e->dt != ZS_DTYPE_F32 && e->view_max)
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_GATHERED, e->view_max * 4,
                                 (void **)&e->view, "fp32 layer view", err));
    if (e->stage == 3 && e->cfg.zero_quantized_gradients) {
        e->rsq_bytes = zs_coll_rsq8_work_bytes(e->coll, e->max_seg_pad / (uint64_t)e->W);
        ZS_ENG_TRY(
            zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_COMM, e->rsq_bytes, &e->rsq, "qgZ work", err));
    }
    if (e->hpz) {
        e->sec_bytes = e->Ppad / (uint64_t)e->hpz * e->esz;
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_HPZ, e->sec_bytes, &e->sec,
                                 "hpZ secondary partition", err));
    }
    if (e->mics_hier) { /* MiCS's two-hop gathers: the work of one segment */
        e->hbuf_bytes = e->max_seg_pad * e->esz;
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_COMM, e->hbuf_bytes, &e->hbuf,
                                 "MiCS two-hop gather work", err));
    }
    if (e->stage == 3 && e->cfg.zero_quantized_weights) {
        e->qbuf_bytes = (uint64_t)e->W * zs_quant_record_bytes(e->max_seg_pad / (uint64_t)e->W);
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_COMM, e->qbuf_bytes, &e->qbuf,
                                 "qwZ records", err));
    }
    if (!e->offload) {
        uint64_t n = (e->stage == 0 ? full : part) * 4;
        float **t[3] = {&e->master, &e->exp_avg, &e->exp_avg_sq};
        for (int x = 0; x < 3; x++) {
            ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_OPTIMIZER, n, (void **)t[x],
                                     "optimizer state", err));
            ZS_ENG_TRY(zs_dev_memset(e->compute, *t[x], 0, n, err));
        }
    }
    /* per segment: sum of squares and non-finite flag, summed on the host
     * in segment order (the same bits whether buckets are summed as they
     * are reduced or after the step's last reduction) */
    size_t nbytes = 2 * (size_t)e->ns * sizeof(double);
    ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, nbytes, (void **)&e->normacc,
                             "norm", err));
    ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_SCRATCH, nbytes, (void **)&e->normhost,
                             "norm", err));
    ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->ev_compute, err));
    ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->ev_copy, err));
    ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->ev_reduced, err));
    e->ev_staged = calloc((size_t)e->nb, sizeof *e->ev_staged);
    if (!e->ev_staged)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int k = 0; k < e->nb; k++)
        ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->ev_staged[k], err));
    for (int i = 0; i < e->ngslot; i++)
        ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->gslot[i].ev, err));
    for (int i = 0; i < ZS_COMM_SLOTS; i++) {
        ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->cslot[i].ev, err));
        ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->aslot[i].ev, err));
    }
    for (int k = 0; k < e->ns; k++)
        ZS_ENG_TRY(zs_dev_event_create(e->dev, &e->s[k].gev, err));
    /* Stage 3 pass order: forward 0..L-1, then backward L-1..0. */
    e->order = malloc(2 * (size_t)e->nlayers * sizeof *e->order);
    if (!e->order)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < e->nlayers; i++) {
        e->order[i] = i;
        e->order[e->nlayers + i] = e->nlayers - 1 - i;
    }
    for (int i = 0; i < e->nlayers; i++) {
        uint64_t need = e->s[e->layer_seg[i]].n_pad;
        for (int d = 0; e->deps[i][d] >= 0; d++)
            if (e->layer_seg[e->deps[i][d]] != e->layer_seg[i])
                need += e->s[e->layer_seg[e->deps[i][d]]].n_pad;
        if (need > e->need_max)
            e->need_max = need;
    }
    return ZS_OK;
}

/* The offload staging (Ppad / W elements of dt, pinned, category comm):
 * the client's shared-memory segment, registered with the device, when a
 * co-located server takes it (transport auto or shm); else the device's
 * pinned memory. Either way the memory table counts it as pinned comm.
 * Errors: transport shm and a server left on tcp; a Hello that failed. */
static int alloc_staging(zs_engine_t *e, int transport, zs_err_t *err)
{
    size_t bytes = (size_t)(e->Ppad / (uint64_t)e->W) * e->esz;
    /* the delayed update's copy follows the staging, page-aligned */
    size_t dpu = e->cfg.offload_delay_after >= 0 ? (bytes + 4095) & ~(size_t)4095 : 0;
    void *p = NULL;
    zs_err_t why = {0, ""};
    int rc = zs_client_shm_staging(e->client, dpu + bytes, &p, &why);
    if (rc == ZS_OK) {
        rc = zs_dev_host_register(e->dev, p, dpu + bytes, ZS_MEM_COMM, err);
        if (rc)
            return zs_err_set(err, rc, "offload staging in shared memory (%zu bytes): %s",
                              dpu + bytes, err->msg);
        e->staging = p;
        e->pdelay = dpu ? (char *)p + dpu : NULL;
        e->shm_staging = 1;
        return ZS_OK;
    }
    if (transport == ZS_TRANSPORT_SHM) {
        *err = why;
        return rc;
    }
    /* auto: pinned staging once the client has decided every server's
     * transport (each reason logged); a Hello that failed fails here, as
     * the start would (not a quiet tcp run, nor the same wait twice) */
    for (int i = 0; transport == ZS_TRANSPORT_AUTO && i < zs_client_nservers(e->client); i++) {
        const char *w;
        zs_client_transport(e->client, i, &w);
        if (!w[0]) {
            *err = why;
            return rc;
        }
    }
    if (e->wrank == 0) /* auto's reasons, or --transport tcp: the log says which, always */
        ZS_INFO("offload staging in pinned memory: %s", why.msg);
    if (dpu)
        ZS_ENG_TRY(zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_COMM, bytes, &e->pdelay,
                                 "delayed parameters", err));
    return zs__eng_alloc(e, ZS_SPACE_PINNED, ZS_MEM_COMM, bytes, &e->staging, "offload staging",
                         err);
}

int zs_engine_create(const zs_engine_opts_t *o, const zs_model_t *model, zs_engine_t **out,
                     zs_err_t *err)
{
    *out = NULL;
    zs_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    e->cfg = *o->cfg;
    e->coll = o->coll;
    e->dev = o->coll->dev;
    e->comm = zs_coll_stream(o->coll);
    e->rank = e->wrank = o->coll->rank;
    e->W = e->Wd = o->coll->size;
    e->pc = o->coll;
    e->stage = e->cfg.stage;
    e->offload = e->cfg.offload_optimizer;
    e->offload_param = e->cfg.offload_param && e->stage == 3;
    e->debug = o->debug;
    e->dt = e->cfg.dtype;
    e->esz = zs_dtype_size(e->dt);
    snprintf(e->model_name, sizeof e->model_name, "%s", o->model_name ? o->model_name : "zs-model");
    /* keys read but not acted on are reported by the config parser ("no effect") */
    int rc = copy_model(e, model, err);
    if (!rc)
        rc = zs__eng_set_manifest(e, o->manifest, err);
    if (!rc && (e->stage < 0 || e->stage > 3 || e->esz == 0))
        rc = zs_err_set(err, ZS_ERR_INVALID, "stage %d / dtype %d not supported", e->stage, e->dt);
    if (!rc && e->offload && !o->servers)
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "offload_optimizer needs shard servers (--servers host:port,...)");
    if (!rc && e->cfg.offload_delay_after >= 0 && (e->stage < 1 || e->stage > 2))
        rc = zs_err_set(err, ZS_ERR_INVALID,
                        "offload_optimizer.delayed_update_after: the delayed parameter update "
                        "runs at stages 1-2 (this is stage %d); leave it out or set it to -1",
                        e->stage);
    /* a model that reads 16-bit parameters itself needs no fp32 views */
    if (!rc && e->dt != ZS_DTYPE_F32 && e->m.set_param_dtype) {
        rc = e->m.set_param_dtype(e->m.self, e->dt, err);
        e->params16 = rc == ZS_OK;
    }
    if (!rc)
        rc = zs__eng_mics_setup(e, err);
    if (!rc)
        rc = hpz_setup(e, err);
    if (!rc)
        rc = qgz_check(e, err);
    uint64_t cap = (uint64_t)e->cfg.reduce_bucket_size;
    if (!rc)
        rc = make_layout(e, cap ? cap : 1, err);
    if (!rc)
        rc = copy_groups(e, o->groups, o->ngroups, err); /* checked against P */
    if (!rc)
        rc = zs_dev_stream_create(e->dev, 0, "compute", &e->compute, err);
    if (!rc)
        rc = zs_dev_stream_create(e->dev, 0, "copy", &e->copy, err);
    if (!rc)
        rc = alloc_state(e, err);
    if (!rc) { /* what the model allocates as scratch at bind is its own */
        zs_dev_mem_t m0, m1;
        zs_dev_mem_get(e->dev, &m0);
        rc = e->m.bind(e->m.self, e->dev, e->compute, err);
        zs_dev_mem_get(e->dev, &m1);
        for (int sp = 0; sp < ZS_NSPACES; sp++)
            e->model_scratch += m1.cur[sp][ZS_MEM_SCRATCH] - m0.cur[sp][ZS_MEM_SCRATCH];
        e->model_scratch_dev =
            m1.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH] - m0.cur[ZS_SPACE_DEVICE][ZS_MEM_SCRATCH];
    }
    if (rc)
        goto fail;
    zs_loss_scale_init(&e->ls, e->dt == ZS_DTYPE_F16 ? &e->cfg.fp16 : NULL);
    rc = zs__eng_init_state(e, err);
    if (rc)
        goto fail;
    if (o->servers) {
        zs_client_opts_t co = {.servers = o->servers,
                               .token = o->token,
                               .timeout_ms = o->server_timeout_ms,
                               .transport = o->transport,
                               .require_nvme = e->cfg.offload_nvme};
        rc = zs_client_create(&co, &e->client, err);
        if (!rc)
            rc = zs_client_set_groups(e->client, e->groups, e->ngroups, err);
        if (!rc && e->offload)
            rc = alloc_staging(e, o->transport, err);
        if (!rc && e->offload)
            rc = zs__eng_pusher_start(e, err);
        if (!rc && e->offload && (e->cfg.offload_stream || e->cfg.offload_delay_after >= 0))
            rc = zs__eng_puller_start(e, err);
        if (rc)
            goto fail;
    }
    if (!rc && !e->offload && e->cfg.offload_delay_after >= 0) /* AdamW writes it in process */
        rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_OPTIMIZER,
                           (size_t)(e->Ppad / (uint64_t)e->W) * e->esz, &e->pdelay,
                           "delayed parameters", err);
    if (!rc)
        rc = zs__eng_after_update(e, err);
    if (rc)
        goto fail;
    *out = e;
    return ZS_OK;
fail:
    zs_engine_destroy(e);
    return rc;
}

void zs_engine_destroy(zs_engine_t *e)
{
    if (!e)
        return;
    zs__eng_pull_drain(e);
    zs__eng_puller_stop(e);
    zs__eng_pusher_stop(e);
    /* Let queued work finish before its memory goes. */
    if (e->compute)
        zs_dev_stream_sync(e->compute, NULL);
    if (e->copy)
        zs_dev_stream_sync(e->copy, NULL);
    if (e->coll)
        zs_coll_sync(e->coll, NULL);
    zs__eng_gather_free_all(e);
    zs_dev_free(e->dev, e->qbuf);
    zs_dev_free(e->dev, e->sec);
    zs_dev_free(e->dev, e->rsq);
    zs_dev_free(e->dev, e->hbuf);
    for (int k = 0; e->s && k < e->ns; k++)
        zs_dev_event_destroy(e->s[k].gev);
    for (int i = 0; e->gslot && i < e->ngslot; i++) {
        zs_dev_free(e->dev, e->gslot[i].p);
        zs_dev_event_destroy(e->gslot[i].ev);
    }
    for (int i = 0; i < ZS_COMM_SLOTS; i++) {
        zs_dev_free(e->dev, e->cslot[i].p);
        zs_dev_event_destroy(e->cslot[i].ev);
        zs_dev_free(e->dev, e->aslot[i].p);
        zs_dev_event_destroy(e->aslot[i].ev);
    }
    for (int k = 0; e->ev_staged && k < e->nb; k++)
        zs_dev_event_destroy(e->ev_staged[k]);
    free(e->ev_staged);
    zs_dev_event_destroy(e->ev_compute);
    zs_dev_event_destroy(e->ev_copy);
    zs_dev_event_destroy(e->ev_reduced);
    if (e->shm_staging) { /* the segment goes with the client: unregister it first */
        zs_dev_host_unregister(e->dev, e->staging);
        e->staging = NULL;
        e->pdelay = NULL; /* inside the segment */
    }
    zs__eng_sums_free(e);
    zs_client_destroy(e->client);
    zs__pnv_destroy(e);
    if (e->dev) {
        zs_dev_free(e->dev, e->params);
        zs_dev_free(e->dev, e->grads);
        zs_dev_free(e->dev, e->view);
        zs_dev_free(e->dev, e->master);
        zs_dev_free(e->dev, e->exp_avg);
        zs_dev_free(e->dev, e->exp_avg_sq);
        zs_dev_free(e->dev, e->normacc);
        zs_dev_free(e->dev, e->normhost);
        zs_dev_free(e->dev, e->staging);
        zs_dev_free(e->dev, e->pdelay);
    }
    zs_dev_stream_destroy(e->compute);
    zs_dev_stream_destroy(e->copy);
    for (int i = 0; e->deps && i < e->nlayers; i++)
        free(e->deps[i]);
    free(e->deps);
    free(e->deps_ro);
    free(e->manifest);
    free(e->groups);
    free(e->layer_off);
    free(e->layer_seg);
    free(e->order);
    free(e->gslot);
    free(e->s);
    free(e->b);
    free(e);
}

uint64_t zs_engine_step_count(const zs_engine_t *e)
{
    return e->step;
}

uint64_t zs_engine_num_params(const zs_engine_t *e)
{
    return e->P;
}

void zs_engine_transport_line(const zs_engine_t *e, char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = 0;
    if (!e->offload || !e->client)
        return;
    int S = zs_client_nservers(e->client), on = 0, first = -1;
    const char *why = "", *w;
    for (int i = 0; i < S; i++) {
        if (zs_client_transport(e->client, i, &w) == ZS_TRANSPORT_SHM)
            on++;
        else if (first < 0)
            first = i, why = w;
    }
    if (on == S)
        snprintf(buf, n, "shared memory with all %d server%s (staging in a segment they map)", S,
                 S == 1 ? "" : "s");
    else
        snprintf(buf, n, "%s%d of %d servers over TCP; server %d: %s",
                 on ? "shared memory with the others, " : "", S - on, S, first,
                 why[0] ? why : "tcp");
}

int zs_engine_get_params(zs_engine_t *e, float *out, zs_err_t *err)
{
    float *tmp = NULL;
    uint64_t ch = xfer_chunk(e);
    ZS_ENG_TRY(zs__eng_pull_finish(e, 0, err)); /* the last step's parameters, landed */
    ZS_ENG_TRY(zs__eng_delay_land(e, err));     /* a delayed update too: a flush */
    int rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_SCRATCH, (size_t)ch * 4, (void **)&tmp,
                           "parameter export", err);
    for (int k = 0; k < e->ns && !rc; k++) {
        zs__seg_t *s = &e->s[k];
        if (s->n == 0)
            continue;
        /* stages 0-2: from the parameters; stage 3: from the segment
         * gathered now (its fp32 view, or its dt elements with params16) */
        int was = s->gbuf != NULL, st3 = e->stage == 3;
        void *src = e->stage < 3 ? zs__at(e, e->params, s->pbase) : NULL;
        if (st3) {
            rc = zs__eng_gather_seg(e, k, err);
            if (!rc)
                rc = zs_dev_stream_wait(e->compute, s->gev, err);
            src = s->g32 ? (void *)s->g32 : s->gbuf;
        }
        int sdt = st3 && s->g32 ? ZS_DTYPE_F32 : (int)e->dt;
        /* chunk by chunk through tmp, in stream order */
        for (uint64_t a = 0; a < s->n && !rc; a += ch) {
            uint64_t z = a + ch < s->n ? a + ch : s->n;
            rc = zs_dev_cast(e->compute, tmp, ZS_DTYPE_F32, (char *)src + a * zs_dtype_size(sdt),
                             sdt, z - a, err);
            if (!rc)
                rc = zs_dev_memcpy(e->compute, out + s->off + a, tmp, (z - a) * 4, err);
        }
        if (st3 && !rc)
            rc = zs_dev_stream_sync(e->compute, err);
        if (st3 && !was)
            zs__eng_drop_seg(e, k);
    }
    if (!rc)
        rc = zs_dev_stream_sync(e->compute, err);
    zs_dev_free(e->dev, tmp);
    return rc;
}
