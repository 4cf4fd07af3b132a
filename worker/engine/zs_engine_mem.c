/*
 * zs_engine_mem.c - memory that is measured: the device allocator's counts
 * per category and space beside the ZeRO formulas (the seed's model-state
 * bytes) and the working set the configuration allows, a check that no
 * category exceeds formula + working set, and the per-worker table zs-train
 * prints.
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

static void working(const zs_engine_t *e, uint64_t *w)
{
    uint64_t W = (uint64_t)e->W, k = e->esz;
    int half = e->dt != ZS_DTYPE_F32;
    memset(w, 0, ZS_MEM_NCATS * sizeof *w);
    /* fp32 compute copies (stages 0-2) or stage-3 gathers */
    if (e->stage < 3) {
        w[ZS_MEM_GATHERED] = half ? 4 * e->Ppad : 0;
    } else {
        uint64_t pers = 0;
        for (int i = 0; i < e->ns; i++)
            if (e->s[i].persistent && e->s[i].n)
                pers += e->s[i].n_pad * (k + (half ? 4 : 0));
        uint64_t elems = (uint64_t)e->cfg.stage3_max_live_parameters +
                         (uint64_t)e->cfg.stage3_prefetch_bucket_size + e->need_max;
        w[ZS_MEM_GATHERED] = pers + elems * (k + (half ? 4 : 0));
    }
    /* gradient scratch slots of the largest bucket, the norm, the
     * one-segment fp32 buffers of init and parameter export, and what the
     * model allocated as scratch when it was bound (measured then: the
     * model's own working set) */
    w[ZS_MEM_SCRATCH] = (uint64_t)e->ngslot * e->max_bucket_pad * 4 + 2 * 2 * sizeof(double) +
                        2 * e->max_seg_pad * 4 + e->model_scratch;
    /* 16-bit reduce buffers, offload staging of one partition, optimizer
     * state transfers (one fp32 segment partition), small host values of
     * the collectives */
    w[ZS_MEM_COMM] = (e->stage >= 2 && half ? ZS_COMM_SLOTS * e->max_bucket_pad * k : 0) +
                     (e->offload ? e->Ppad / W * k : 0) +
                     (!e->offload ? e->max_seg_pad / W * 4 : 0) + 4096;
}

void zs_engine_mem(zs_engine_t *e, zs_engine_mem_t *out)
{
    memset(out, 0, sizeof *out);
    zs_dev_mem_get(e->dev, &out->measured);
    formula(e, out->formula);
    working(e, out->working);
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
    static const int cats[] = {ZS_MEM_PARAMS,   ZS_MEM_GRADS, ZS_MEM_OPTIMIZER,
                               ZS_MEM_GATHERED, ZS_MEM_COMM,  ZS_MEM_SCRATCH};
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) {
        int c = cats[i];
        uint64_t peak = peak_of(&m.measured, c), lim = m.formula[c] + m.working[c];
        if (peak > lim)
            return zs_err_set(err, ZS_ERR_RANGE,
                              "rank %d: measured peak %s memory %llu bytes > formula %llu + "
                              "working set %llu",
                              e->rank, zs_memcat_name(c), (unsigned long long)peak,
                              (unsigned long long)m.formula[c], (unsigned long long)m.working[c]);
    }
    return ZS_OK;
}

#define NCOL (ZS_MEM_NCATS * 3 + 2) /* per category: peak, formula, working; held, rss */

int zs_engine_print_mem(zs_engine_t *e, FILE *f, zs_err_t *err)
{
    zs_engine_mem_t m;
    zs_engine_mem(e, &m);
    size_t n = (size_t)e->W * NCOL;
    float *all = NULL;
    int rc = zs__eng_alloc(e, ZS_SPACE_DEVICE, ZS_MEM_COMM, n * sizeof *all, (void **)&all,
                           "memory table", err);
    float *host = calloc(n, sizeof *host);
    if (!rc && !host)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (!rc) {
        float *mine = host + (size_t)e->rank * NCOL;
        uint64_t held = 0;
        for (int c = 0; c < ZS_MEM_NCATS; c++) {
            mine[3 * c] = (float)peak_of(&m.measured, c);
            mine[3 * c + 1] = (float)m.formula[c];
            mine[3 * c + 2] = (float)m.working[c];
        }
        for (int s = 0; s < ZS_NSPACES; s++)
            held += m.measured.held_peak[s];
        mine[3 * ZS_MEM_NCATS] = (float)held;
        mine[3 * ZS_MEM_NCATS + 1] = (float)m.rss;
        rc = zs_dev_memcpy(e->comm, all, host, n * sizeof *all, err);
        if (!rc)
            rc = zs_coll_all_gather(e->coll, all, NCOL, ZS_DTYPE_F32, NULL, NULL, err);
        if (!rc)
            rc = zs_dev_memcpy(e->comm, host, all, n * sizeof *all, err);
        if (!rc)
            rc = zs_coll_sync(e->coll, err);
    }
    if (rc == ZS_OK && e->rank == 0) {
        fprintf(f,
                "memory per worker (MB, measured peak / ZeRO formula / working set allowed): "
                "stage %d, W=%d, %s, optimizer %s%s, P=%llu\n",
                e->stage, e->W, zs_dtype_name(e->dt), e->offload ? "on servers" : "in-process",
                e->offload_param ? ", params in pinned host memory" : "", (unsigned long long)e->P);
        fprintf(f, "  %-4s", "rank");
        for (int c = 0; c < ZS_MEM_NCATS; c++)
            fprintf(f, " %22s", zs_memcat_name(c));
        fprintf(f, " %9s %9s\n", "held", "rss");
        for (int r = 0; r < e->W; r++) {
            const float *x = host + (size_t)r * NCOL;
            fprintf(f, "  %-4d", r);
            for (int c = 0; c < ZS_MEM_NCATS; c++) {
                char cell[64];
                if (c == ZS_MEM_ACTIVATIONS)
                    snprintf(cell, sizeof cell, "%.2f / - / -", x[3 * c] / 1e6);
                else
                    snprintf(cell, sizeof cell, "%.2f/%.2f/%.2f", x[3 * c] / 1e6,
                             x[3 * c + 1] / 1e6, x[3 * c + 2] / 1e6);
                fprintf(f, " %22s", cell);
            }
            fprintf(f, " %9.2f %9.2f\n", x[3 * ZS_MEM_NCATS] / 1e6, x[3 * ZS_MEM_NCATS + 1] / 1e6);
        }
    }
    zs_dev_free(e->dev, all);
    free(host);
    return rc;
}
