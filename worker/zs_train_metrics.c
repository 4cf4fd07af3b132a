/*
 * zs_train_metrics.c - zs-train's metrics (see zs_train_metrics.h; names in
 * docs/metrics.md). Series are looked up once here and then set lock-free;
 * memory series (space x category) are created the first time that space
 * and category hold anything.
 */
#include <stdlib.h>

#include "zs_train_metrics.h"

enum { PH_FORWARD, PH_BACKWARD, PH_COMM, PH_OPTIMIZER, PH_TOTAL, PH_N };
static const char *const k_phases[PH_N] = {"forward", "backward", "comm", "optimizer", "total"};

struct zs_train_metrics {
    zs_metrics_t *reg;
    zs_series_t *spec_hits, *spec_rollbacks;
    zs_series_t *step, *loss, *lr, *scale, *norm, *tps, *tokens, *steps, *skipped, *ckpts,
        *ckpt_step, *recoveries, *recovered_step, *workers, *params, *val_loss, *val_step;
    zs_series_t *dur[PH_N], *sec[PH_N];
    zs_metric_t *mem_cur, *mem_peak;
    zs_series_t *held[ZS_NSPACES];
    zs_series_t *cur[ZS_NSPACES][ZS_MEM_NCATS], *peak[ZS_NSPACES][ZS_MEM_NCATS];
    /* collective bytes [0 intra, 1 inter]: per kind since start, and the last step's */
    zs_series_t *cbytes[2][ZS_COLL_NKINDS], *cstep[2];
};

/* Register a family and return its series for `value` of its one label
 * (NULL: a family without labels). Sets *rc on failure. */
static zs_series_t *reg1(zs_train_metrics_t *tm, const char *name, zs_metric_type_t type,
                         const char *help, const char *label, const char *value, int *rc,
                         zs_err_t *err)
{
    zs_metric_t *f;
    if (*rc || (*rc = zs_metrics_add(tm->reg, name, type, help, label ? 1 : 0,
                                     label ? &label : NULL, &f, err)))
        return NULL;
    const char *vals[1] = {value};
    zs_series_t *s = zs_metric_series(f, label ? vals : NULL);
    if (!s)
        *rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    return s;
}

int zs_train_metrics_create(const char *hostport, int workers, zs_train_metrics_t **out,
                            zs_err_t *err)
{
    *out = NULL;
    zs_train_metrics_t *tm = calloc(1, sizeof *tm);
    if (!tm)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    int rc = zs_metrics_create(&tm->reg, err);
    const zs_metric_type_t G = ZS_METRIC_GAUGE, C = ZS_METRIC_COUNTER;
    tm->step = reg1(tm, "zs_train_step", G, "Last completed training step.", 0, 0, &rc, err);
    tm->loss = reg1(tm, "zs_train_loss", G, "Loss of the last step (mean over the global batch).",
                    0, 0, &rc, err);
    tm->val_loss =
        reg1(tm, "zs_train_val_loss", G,
             "Validation loss of the last evaluation (--val-data; 0 before one).", 0, 0, &rc, err);
    tm->val_step =
        reg1(tm, "zs_train_val_step", G, "Step of the last validation loss.", 0, 0, &rc, err);
    tm->lr =
        reg1(tm, "zs_train_learning_rate", G, "Learning rate of the last step.", 0, 0, &rc, err);
    tm->scale =
        reg1(tm, "zs_train_loss_scale", G,
             "Loss scale of the last step (1 without fp16 dynamic scaling).", 0, 0, &rc, err);
    tm->norm = reg1(tm, "zs_train_grad_norm", G,
                    "Global gradient norm of the last step, unscaled, before clipping (+Inf or "
                    "NaN on overflow).",
                    0, 0, &rc, err);
    tm->tps = reg1(tm, "zs_train_tokens_per_second", G,
                   "Tokens the whole job trained per second in the last step (wall time).", 0, 0,
                   &rc, err);
    tm->tokens = reg1(tm, "zs_train_tokens_total", C,
                      "Tokens the whole job trained since this process started.", 0, 0, &rc, err);
    tm->steps = reg1(tm, "zs_train_steps_total", C, "Steps completed since this process started.",
                     0, 0, &rc, err);
    tm->skipped = reg1(tm, "zs_train_steps_skipped_total", C,
                       "Steps skipped (fp16 overflow) since this process started.", 0, 0, &rc, err);
    tm->spec_hits = reg1(tm, "zs_train_spec_hits_total", C,
                         "Steps whose commit carried the scalars the pushes stated, so the "
                         "servers kept their speculative update (offload_optimizer.super_offload).",
                         0, 0, &rc, err);
    tm->spec_rollbacks = reg1(tm, "zs_train_spec_rollbacks_total", C,
                              "Steps whose commit carried other scalars (clipping, overflow), so "
                              "the servers rolled their speculative update back.",
                              0, 0, &rc, err);
    zs_metric_t *fd = NULL, *fs = NULL;
    const char *phase = "phase";
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_step_duration_seconds", G,
                            "Seconds of the last step by phase (forward, backward, comm, "
                            "optimizer: this worker's split; total: wall time of the step).",
                            1, &phase, &fd, err);
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_step_seconds_total", C,
                            "Seconds spent in steps since this process started, by phase.", 1,
                            &phase, &fs, err);
    for (int p = 0; !rc && p < PH_N; p++) {
        const char *vals[1] = {k_phases[p]};
        if (!(tm->dur[p] = zs_metric_series(fd, vals)) ||
            !(tm->sec[p] = zs_metric_series(fs, vals)))
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    const char *sc[2] = {"space", "category"};
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_memory_bytes", G,
                            "Bytes this worker has allocated now, by memory space and category, "
                            "as the device allocator counts them.",
                            2, sc, &tm->mem_cur, err);
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_memory_peak_bytes", G,
                            "Most bytes this worker has held at once, by memory space and "
                            "category.",
                            2, sc, &tm->mem_peak, err);
    zs_metric_t *fh = NULL;
    const char *space = "space";
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_memory_held_bytes", G,
                            "Bytes the allocator holds per memory space: allocated plus freed "
                            "blocks kept for reuse.",
                            1, &space, &fh, err);
    for (int s = 0; !rc && s < ZS_NSPACES; s++) {
        const char *vals[1] = {zs_space_name(s)};
        if (!(tm->held[s] = zs_metric_series(fh, vals)))
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    zs_metric_t *fb = NULL, *fsb = NULL;
    const char *sk[2] = {"scope", "kind"}, *scope = "scope", *scopes[2] = {"intra", "inter"};
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_coll_bytes_total", C,
                            "Bytes this worker's collectives sent since this process started, "
                            "within its node (intra) or to other nodes (inter), by collective "
                            "kind (each peer's share counted as sent directly).",
                            2, sk, &fb, err);
    if (!rc)
        rc = zs_metrics_add(tm->reg, "zs_train_coll_step_bytes", G,
                            "Bytes this worker's collectives sent in the last step, intra or "
                            "inter node.",
                            1, &scope, &fsb, err);
    for (int j = 0; !rc && j < 2; j++) {
        const char *v1[1] = {scopes[j]};
        if (!(tm->cstep[j] = zs_metric_series(fsb, v1)))
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        for (int k = 0; !rc && k < ZS_COLL_NKINDS; k++) {
            const char *v2[2] = {scopes[j], zs_coll_kind_name(k)};
            if (!(tm->cbytes[j][k] = zs_metric_series(fb, v2)))
                rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        }
    }
    tm->ckpts =
        reg1(tm, "zs_train_checkpoints_total", C,
             "Checkpoints completed on all servers since this process started.", 0, 0, &rc, err);
    tm->ckpt_step =
        reg1(tm, "zs_train_checkpoint_step", G,
             "Step of the last checkpoint this process completed (0: none yet).", 0, 0, &rc, err);
    tm->recoveries =
        reg1(tm, "zs_train_recoveries_total", C,
             "Recoveries from a lost shard server since this process started.", 0, 0, &rc, err);
    tm->recovered_step =
        reg1(tm, "zs_train_recovered_step", G,
             "Step the last recovery rolled training back to (0: none yet).", 0, 0, &rc, err);
    tm->workers =
        reg1(tm, "zs_train_workers", G, "Workers (MPI ranks) in the job.", 0, 0, &rc, err);
    tm->params = reg1(tm, "zs_train_parameters", G, "Parameters of the model.", 0, 0, &rc, err);
    if (!rc)
        rc = zs_metrics_add_process(tm->reg, "zs_train", err);
    if (!rc) {
        zs_series_set(tm->workers, workers);
        rc = zs_metrics_serve(tm->reg, hostport, err);
    }
    if (rc) {
        zs_train_metrics_destroy(tm);
        return rc;
    }
    *out = tm;
    return ZS_OK;
}

zs_metrics_t *zs_train_metrics_registry(zs_train_metrics_t *tm)
{
    return tm ? tm->reg : NULL;
}

void zs_train_metrics_start(zs_train_metrics_t *tm, uint64_t params, uint64_t step)
{
    if (!tm)
        return;
    zs_series_set(tm->params, (double)params);
    zs_series_set(tm->step, (double)step);
}

/* Memory series of a space and category, created once it has held
 * anything (peak > 0), so current and peak appear together. */
static void set_mem(zs_series_t **s, zs_metric_t *f, int space, int cat, uint64_t bytes,
                    uint64_t peak)
{
    if (!*s && peak) {
        const char *vals[2] = {zs_space_name(space), zs_memcat_name(cat)};
        *s = zs_metric_series(f, vals);
    }
    if (*s)
        zs_series_set(*s, (double)bytes);
}

void zs_train_metrics_step(zs_train_metrics_t *tm, const zs_step_stats_t *st, double seconds,
                           double tokens, zs_engine_t *e)
{
    if (!tm)
        return;
    zs_series_set(tm->step, (double)st->step);
    zs_series_set(tm->loss, st->loss);
    zs_series_set(tm->lr, st->lr);
    zs_series_set(tm->scale, st->loss_scale);
    zs_series_set(tm->norm, st->grad_norm);
    zs_series_set(tm->tps, seconds > 0 ? tokens / seconds : 0);
    zs_series_add(tm->tokens, tokens);
    zs_series_add(tm->steps, 1);
    if (st->skipped)
        zs_series_add(tm->skipped, 1);
    if (st->spec > 0)
        zs_series_add(tm->spec_hits, 1);
    if (st->spec < 0)
        zs_series_add(tm->spec_rollbacks, 1);
    const double ph[PH_N] = {st->ms_forward / 1e3, st->ms_backward / 1e3, st->ms_comm / 1e3,
                             st->ms_optimizer / 1e3, seconds};
    for (int p = 0; p < PH_N; p++) {
        zs_series_set(tm->dur[p], ph[p]);
        zs_series_add(tm->sec[p], ph[p]);
    }
    for (int k = 0; k < ZS_COLL_NKINDS; k++) {
        zs_series_add(tm->cbytes[0][k], (double)st->bytes.intra[k]);
        zs_series_add(tm->cbytes[1][k], (double)st->bytes.inter[k]);
    }
    zs_series_set(tm->cstep[0], (double)zs_coll_bytes_intra(&st->bytes));
    zs_series_set(tm->cstep[1], (double)zs_coll_bytes_inter(&st->bytes));
    zs_engine_mem_t m;
    zs_engine_mem(e, &m);
    for (int s = 0; s < ZS_NSPACES; s++) {
        zs_series_set(tm->held[s], (double)m.measured.held[s]);
        for (int c = 0; c < ZS_MEM_NCATS; c++) {
            uint64_t peak = m.measured.peak[s][c];
            set_mem(&tm->cur[s][c], tm->mem_cur, s, c, m.measured.cur[s][c], peak);
            set_mem(&tm->peak[s][c], tm->mem_peak, s, c, peak, peak);
        }
    }
}

void zs_train_metrics_val(zs_train_metrics_t *tm, uint64_t step, double loss)
{
    if (!tm)
        return;
    zs_series_set(tm->val_loss, loss);
    zs_series_set(tm->val_step, (double)step);
}

void zs_train_metrics_checkpoint(zs_train_metrics_t *tm, uint64_t step)
{
    if (!tm)
        return;
    zs_series_add(tm->ckpts, 1);
    zs_series_set(tm->ckpt_step, (double)step);
}

void zs_train_metrics_recovered(zs_train_metrics_t *tm, uint64_t step)
{
    if (!tm)
        return;
    zs_series_add(tm->recoveries, 1);
    zs_series_set(tm->recovered_step, (double)step);
    zs_series_set(tm->step, (double)step);
}

void zs_train_metrics_destroy(zs_train_metrics_t *tm)
{
    if (!tm)
        return;
    zs_metrics_destroy(tm->reg);
    free(tm);
}
