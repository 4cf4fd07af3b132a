/*
 * zs_engine_mem.c - memory that is measured: the device allocator's counts
 * per category and space beside the ZeRO formulas (the seed's model-state
 * bytes) and the working set the configuration allows, the part of those
 * that may be in the device space (with offload_optimizer at stages 2-3 no
 * gradient partition, only reduce buckets), a check that no category
 * exceeds formula + working set nor its device bound, and the per-worker
 * table zs-train prints (all spaces, then the device space alone).
 *
 * The formula and the working set are computed from the configuration and
 * the layout only, never from the allocations they are compared with.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_engine_internal.h"
#include "zs_file.h"

static void formula(const zs_engine_t *e, uint64_t *f)
{
    /* Seed formulas, bytes with Psi = padded parameters: params k (k = 2
     * for 16-bit, 4 for fp32), grads k, optimizer 12 (fp32 master and two
     * moments), each divided by W where the stage partitions it. */
    uint64_t psi = e->Ppad, W = (uint64_t)e->W, k = e->esz;
    memset(f, 0, ZS_MEM_NCATS * sizeof *f);
    f[ZS_MEM_PARAMS] = e->stage >= 3 ? k * psi / W : k * psi;
    f[ZS_MEM_GRADS] = e->stage >= 2 ? k * psi / W : k * psi;
    f[ZS_MEM_OPTIMIZER] = e->offload ? 0 : e->stage >= 1 ? 12 * psi / W : 12 * psi;
}

#define NCOL (ZS_MEM_NCATS * 5 + ZS_NSPACES + 1) /* see zs_engine_print_mem */

/* Bytes of the 16-bit reduce buffers (stages 2-3 with 16-bit gradients;
 * none when buckets are cast straight into staging). */
static uint64_t reduce_buffers(const zs_engine_t *e)
{
    if (e->stage < 2 || e->dt == ZS_DTYPE_F32 || zs__eng_cast_into_staging(e))
        return 0;
    return (uint64_t)e->ncslot * e->max_bucket_pad * e->esz;
}

/* Device bytes of the memory table's all-gather and small host values of
 * the collectives. */
static uint64_t comm_small(const zs_engine_t *e)
{
    return (uint64_t)e->Wd * NCOL * sizeof(float) + 4096;
}

/* Bytes of init and export's device fp32 chunk (zs_engine.c). */
static uint64_t xfer_bytes(const zs_engine_t *e)
{
    return 4 * (e->max_seg_pad < ZS_XFER_CHUNK ? e->max_seg_pad : ZS_XFER_CHUNK);
}

/* fp32 gradient slots: the general pool and one per early bucket. */
static uint64_t gslot_bytes(const zs_engine_t *e)
{
    return 4 * ((uint64_t)e->ngen * e->gen_pad + (uint64_t)(e->ngslot - e->ngen) * e->early_pad);
}

static void working(const zs_engine_t *e, uint64_t *w)
{
    uint64_t W = (uint64_t)e->W, k = e->esz;
    memset(w, 0, ZS_MEM_NCATS * sizeof *w);
    /* fp32 views: stages 0-2 one layer with its deps (e->view), stage 3 the
     * gathers within the budgets */
    uint64_t v = zs__eng_view_esz(e); /* fp32 view bytes per element (0: none) */
    if (e->stage < 3) {
        w[ZS_MEM_GATHERED] = v * e->view_max;
    } else {
        uint64_t pers = 0;
        for (int i = 0; i < e->ns; i++)
            if (e->s[i].persistent && e->s[i].n)
                pers += e->s[i].n_pad * (k + v);
        uint64_t elems = (uint64_t)e->cfg.stage3_max_live_parameters +
                         (uint64_t)e->cfg.stage3_prefetch_bucket_size + e->need_max;
        w[ZS_MEM_GATHERED] = pers + elems * (k + v);
    }
    /* offloaded gradients: the device bucket partitions micro-batches
     * accumulate in (none with one micro-batch per step: the reduce buffer
     * goes to staging as it is; the partition itself is the offload
     * staging, counted under comm) */
    if (zs__eng_grads_offloaded(e) && e->cfg.gradient_accumulation_steps > 1)
        w[ZS_MEM_GRADS] = (uint64_t)e->ncslot * (e->max_bucket_pad / W) * k;
    /* gradient scratch slots of the largest bucket, the per-segment norm
     * (device and pinned), init's one-segment fp32 host buffer and the
     * device chunk of init or parameter export, and what the model allocated
     * as scratch when it was bound (measured then: the model's own working
     * set) */
    w[ZS_MEM_SCRATCH] = gslot_bytes(e) + 2 * 2 * (uint64_t)e->ns * sizeof(double) +
                        e->max_seg_pad * 4 + xfer_bytes(e) + e->model_scratch;
    /* 16-bit reduce buffers, offload staging of one partition (pinned),
     * optimizer state transfers (one fp32 segment partition, pinned), the
     * memory table's all-gather, small host values of the collectives and
     * qwZ's records (W records of the largest part) */
    w[ZS_MEM_HPZ] = e->sec_bytes; /* hpZ: Ppad / L elements */
    /* offload_param nvme: the buffers and the host region of max_in_cpu
     * (both within the formula for most configurations; the buffers are
     * whole 4 KiB blocks, which may exceed a tiny partition) */
    w[ZS_MEM_PARAMS] = e->pnv ? zs__pnv_host_bytes(e) : 0;
    w[ZS_MEM_COMM] = reduce_buffers(e) + (e->offload ? e->Ppad / W * k : 0) +
                     (!e->offload ? e->max_seg_pad / W * 4 : 0) + comm_small(e) + e->qbuf_bytes +
                     e->rsq_bytes + e->hbuf_bytes;
    /* the delayed update's copy of the partition: pinned with offload (page
     * rounded after the staging in a shared segment), else on the device
     * beside the optimizer state that writes it */
    if (e->pdelay && e->offload)
        w[ZS_MEM_COMM] += (e->Ppad / W * k + 4095) & ~(uint64_t)4095;
    if (e->pdelay && !e->offload)
        w[ZS_MEM_OPTIMIZER] = e->Ppad / W * k;
}

/* Of formula + working, what may be device memory (see zs_engine_mem_t). */
static void device_bound(const zs_engine_t *e, const uint64_t *f, const uint64_t *w, uint64_t *d)
{
    memset(d, 0, ZS_MEM_NCATS * sizeof *d);
    d[ZS_MEM_PARAMS] = e->offload_param ? 0 : f[ZS_MEM_PARAMS] + w[ZS_MEM_PARAMS];
    /* with offload at stages 2-3 the gradient partition is pinned staging:
     * the device holds the bucket partitions only (gas > 1), or nothing */
    d[ZS_MEM_GRADS] = zs__eng_grads_offloaded(e) ? w[ZS_MEM_GRADS] : f[ZS_MEM_GRADS];
    d[ZS_MEM_OPTIMIZER] = f[ZS_MEM_OPTIMIZER] + w[ZS_MEM_OPTIMIZER];
    d[ZS_MEM_GATHERED] = w[ZS_MEM_GATHERED];
    /* reduce buffers and the table; staging and state transfers are pinned */
    d[ZS_MEM_COMM] = reduce_buffers(e) + comm_small(e) + e->qbuf_bytes +
                     e->rsq_bytes + /* qwZ, qgZ */
                     e->hbuf_bytes; /* MiCS two hops */
    d[ZS_MEM_HPZ] = e->sec_bytes;
    /* gradient slots, the norm, the fp32 chunk of init or export, the
     * model's device scratch */
    d[ZS_MEM_SCRATCH] = gslot_bytes(e) + 2 * (uint64_t)e->ns * sizeof(double) + xfer_bytes(e) +
                        e->model_scratch_dev;
}

void zs_engine_mem(zs_engine_t *e, zs_engine_mem_t *out)
{
    memset(out, 0, sizeof *out);
    zs_dev_mem_get(e->dev, &out->measured);
    formula(e, out->formula);
    working(e, out->working);
    device_bound(e, out->formula, out->working, out->device);
    out->rss = zs_file_self_rss();
}

static uint64_t peak_of(const zs_dev_mem_t *m, int cat)
{
    uint64_t p = 0;
    for (int s = 0; s < ZS_NSPACES; s++)
        p += m->peak[s][cat];
    return p;
}

int zs_engine_mem_check(zs_engine_t *e, zs_err_t *err)
{
    zs_engine_mem_t m;
    zs_engine_mem(e, &m);
    /* activations belong to the model; everything else is the engine's */
    static const int cats[] = {ZS_MEM_PARAMS, ZS_MEM_GRADS,   ZS_MEM_OPTIMIZER, ZS_MEM_GATHERED,
                               ZS_MEM_COMM,   ZS_MEM_SCRATCH, ZS_MEM_HPZ};
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) {
        int c = cats[i];
        uint64_t peak = peak_of(&m.measured, c), lim = m.formula[c] + m.working[c];
        if (peak > lim)
            return zs_err_set(err, ZS_ERR_RANGE,
                              "rank %d: measured peak %s memory %llu bytes > formula %llu + "
                              "working set %llu",
                              e->wrank, zs_memcat_name(c), (unsigned long long)peak,
                              (unsigned long long)m.formula[c], (unsigned long long)m.working[c]);
        uint64_t dpeak = m.measured.peak[ZS_SPACE_DEVICE][c];
        if (dpeak > m.device[c])
            return zs_err_set(err, ZS_ERR_RANGE,
                              "rank %d: measured peak %s memory in the device space %llu bytes > "
                              "its device bound %llu%s",
                              e->wrank, zs_memcat_name(c), (unsigned long long)dpeak,
                              (unsigned long long)m.device[c],
                              c == ZS_MEM_GRADS && zs__eng_grads_offloaded(e)
                                  ? " (the reduce buckets: with offload_optimizer no gradient "
                                    "partition belongs on the device)"
                                  : "");
    }
    return ZS_OK;
}

/* Row of one worker (NCOL floats): per category [5c] peak of all spaces,
 * [5c+1] formula, [5c+2] working set, [5c+3] device peak, [5c+4] device
 * bound; then the held peak of each space; then RSS. */
int zs_engine_print_mem(zs_engine_t *e, FILE *f, zs_err_t *err)
{
    zs_engine_mem_t m;
    zs_engine_mem(e, &m);
    size_t n = (size_t)e->Wd * NCOL; /* a row per worker of the world */
    float *all = NULL;
    int rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_COMM, n * sizeof *all, (void **)&all,
                           "memory table", err);
    float *host = calloc(n, sizeof *host);
    if (!rc && !host)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    const int H = 5 * ZS_MEM_NCATS; /* first held column */
    if (!rc) {
        float *mine = host + (size_t)e->wrank * NCOL;
        for (int c = 0; c < ZS_MEM_NCATS; c++) {
            mine[5 * c] = (float)peak_of(&m.measured, c);
            mine[5 * c + 1] = (float)m.formula[c];
            mine[5 * c + 2] = (float)m.working[c];
            mine[5 * c + 3] = (float)m.measured.peak[ZS_SPACE_DEVICE][c];
            mine[5 * c + 4] = (float)m.device[c];
        }
        for (int s = 0; s < ZS_NSPACES; s++)
            mine[H + s] = (float)m.measured.held_peak[s];
        mine[H + ZS_NSPACES] = (float)m.rss;
        rc = zs_dev_memcpy(e->comm, all, host, n * sizeof *all, err);
        if (!rc)
            rc = zs_coll_all_gather(e->coll, all, NCOL, ZS_DTYPE_F32, NULL, NULL, err);
        if (!rc)
            rc = zs_dev_memcpy(e->comm, host, all, n * sizeof *all, err);
        if (!rc)
            rc = zs_coll_sync(e->coll, err);
    }
    if (rc == ZS_OK && e->wrank == 0) {
        fprintf(f,
                "memory per worker (MB, measured peak / ZeRO formula / working set allowed): "
                "stage %d, W=%d%s, %s, optimizer %s%s, P=%llu\n",
                e->stage, e->Wd, e->mics ? " (MiCS: partitioned within groups of G)" : "",
                zs_dtype_name(e->dt), e->offload ? "on servers" : "in-process",
                e->pnv             ? ", params in files (offload_param nvme)"
                : e->offload_param ? ", params in pinned host memory"
                                   : "",
                (unsigned long long)e->P);
        fprintf(f, "  %-4s", "rank");
        for (int c = 0; c < ZS_MEM_NCATS; c++)
            fprintf(f, " %22s", zs_memcat_name(c));
        fprintf(f, " %9s %9s\n", "held", "rss");
        for (int r = 0; r < e->Wd; r++) {
            const float *x = host + (size_t)r * NCOL;
            float held = 0;
            fprintf(f, "  %-4d", r);
            for (int c = 0; c < ZS_MEM_NCATS; c++) {
                char cell[64];
                if (c == ZS_MEM_ACTIVATIONS)
                    snprintf(cell, sizeof cell, "%.2f / - / -", x[5 * c] / 1e6);
                else
                    snprintf(cell, sizeof cell, "%.2f/%.2f/%.2f", x[5 * c] / 1e6,
                             x[5 * c + 1] / 1e6, x[5 * c + 2] / 1e6);
                fprintf(f, " %22s", cell);
            }
            for (int s = 0; s < ZS_NSPACES; s++)
                held += x[H + s];
            fprintf(f, " %9.2f %9.2f\n", held / 1e6, x[H + ZS_NSPACES] / 1e6);
        }
        /* The device space alone: what a GPU must hold. */
        fprintf(f, "  device space (MB, measured peak / bound); held peak per space (MB)\n");
        fprintf(f, "  %-4s", "rank");
        for (int c = 0; c < ZS_MEM_NCATS; c++)
            fprintf(f, " %16s", zs_memcat_name(c));
        for (int s = 0; s < ZS_NSPACES; s++)
            fprintf(f, " %9s", zs_space_name(s));
        fprintf(f, "\n");
        for (int r = 0; r < e->Wd; r++) {
            const float *x = host + (size_t)r * NCOL;
            fprintf(f, "  %-4d", r);
            for (int c = 0; c < ZS_MEM_NCATS; c++) {
                char cell[64];
                if (c == ZS_MEM_ACTIVATIONS)
                    snprintf(cell, sizeof cell, "%.2f / -", x[5 * c + 3] / 1e6);
                else
                    snprintf(cell, sizeof cell, "%.2f/%.2f", x[5 * c + 3] / 1e6,
                             x[5 * c + 4] / 1e6);
                fprintf(f, " %16s", cell);
            }
            for (int s = 0; s < ZS_NSPACES; s++)
                fprintf(f, " %9.2f", x[H + s] / 1e6);
            fprintf(f, "\n");
        }
    }
    zs_dev_free(e->dev, all);
    free(host);
    return rc;
}
