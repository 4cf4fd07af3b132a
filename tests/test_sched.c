/*
 * test_sched.c - learning-rate schedules (worker/engine/zs_sched.c).
 *
 * 1. Hand-computed tables (closed forms: log10 values for a log warmup of 10
 *    steps, simple fractions for linear warmup and decay), written in terms
 *    of the optimizer step s: the first two steps run at warmup_min_lr.
 * 2. A step-by-step re-enactment of DeepSpeed: the WarmupLR/WarmupDecayLR
 *    objects as lr_schedules.py writes them (last_batch_iteration = -1 at
 *    construction, get_lr() then, step() after each applied optimizer step)
 *    driven by the engine loop (_take_model_step: optimizer.step() with the
 *    current lr, then lr_scheduler.step() unless the step overflowed). The lr
 *    each optimizer step used must equal zs_sched_lr(s) bit for bit, with s
 *    the number of applied steps before it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zs_sched.h"
#include "zs_test.h"

static zs_sched_config_t mk(zs_sched_type_t type, zs_warmup_type_t wt, double min, double max,
                            int64_t n, int64_t total)
{
    zs_sched_config_t c;
    memset(&c, 0, sizeof c);
    c.type = type;
    c.warmup_type = wt;
    c.warmup_min_lr = min;
    c.warmup_max_lr = max;
    c.warmup_num_steps = n;
    c.total_num_steps = total;
    return c;
}

static void check_table(const zs_sched_config_t *c, const double *want, int n, double rtol,
                        const char *what)
{
    for (int s = 0; s < n; s++) {
        double got = zs_sched_lr(c, -1.0, s);
        TEST_CHECKF(zs_test_close(got, want[s], 1e-18, rtol, NULL), "%s: s=%d lr %.17g want %.17g",
                    what, s, got, want[s]);
    }
}

static void test_tables(void)
{
    /* WarmupLR, log, N = 10, 0 -> 0.01: lr(s) = 0.01 * log10(s) for s = 1..10
     * (log(i + 1) / log(10) with i = s - 1), 0 at s = 0 and s = 1 */
    const double log10k[] = {0.0,
                             0.0,
                             0.30102999566398120,
                             0.47712125471966244,
                             0.60205999132796240,
                             0.69897000433601886,
                             0.77815125038364363,
                             0.84509804001425684,
                             0.90308998699194354,
                             0.95424250943932487,
                             1.0,
                             1.0,
                             1.0};
    double want[13];
    for (int s = 0; s < 13; s++)
        want[s] = 0.01 * log10k[s];
    zs_sched_config_t c = mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LOG, 0.0, 0.01, 10, 0);
    check_table(&c, want, 13, 1e-15, "WarmupLR log");
    /* after warmup it is max exactly (gamma = 1.0) */
    TEST_CHECK(zs_sched_lr(&c, 0, 11) == 0.01 && zs_sched_lr(&c, 0, 1000000) == 0.01);

    /* WarmupLR, linear, N = 4, 0.001 -> 0.005: steps of 0.001 from s = 1 */
    const double lin[] = {0.001, 0.001, 0.002, 0.003, 0.004, 0.005, 0.005, 0.005};
    c = mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LINEAR, 0.001, 0.005, 4, 0);
    check_table(&c, lin, 8, 1e-14, "WarmupLR linear");

    /* WarmupDecayLR, linear, N = 4, T = 12: after warmup gamma = (12 - i) / 8,
     * i = s - 1: down to warmup_min_lr (not 0) at i = 12 and kept there */
    const double dec[] = {0.001, 0.001,  0.002, 0.003,  0.004, 0.005, 0.0045, 0.004, 0.0035,
                          0.003, 0.0025, 0.002, 0.0015, 0.001, 0.001, 0.001,  0.001};
    c = mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LINEAR, 0.001, 0.005, 4, 12);
    check_table(&c, dec, 17, 1e-14, "WarmupDecayLR linear");
    TEST_CHECK(zs_sched_lr(&c, 0, 13) == 0.001 && zs_sched_lr(&c, 0, 500) == 0.001);

    /* WarmupDecayLR, log warmup, N = 10, T = 20, 0 -> 1: decay (20 - i) / 10 */
    c = mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LOG, 0.0, 1.0, 10, 20);
    for (int s = 0; s <= 10; s++)
        TEST_CHECK(zs_test_close(zs_sched_lr(&c, 0, s), log10k[s], 1e-18, 1e-15, NULL));
    const double dlog[] = {1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0};
    for (int k = 0; k < 12; k++)
        TEST_CHECKF(zs_test_close(zs_sched_lr(&c, 0, 11 + k), dlog[k], 1e-17, 1e-15, NULL),
                    "decay s=%d: %.17g", 11 + k, zs_sched_lr(&c, 0, 11 + k));

    /* total_num_steps < warmup_num_steps: DeepSpeed's max(1, T - N) makes
     * the lr fall to min right after warmup */
    c = mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LINEAR, 0.1, 0.5, 4, 3);
    TEST_CHECK(zs_test_close(zs_sched_lr(&c, 0, 4), 0.1 + 0.4 * 0.75, 0, 1e-15, NULL));
    TEST_CHECK(zs_sched_lr(&c, 0, 5) == 0.1 && zs_sched_lr(&c, 0, 50) == 0.1);

    /* warmup_num_steps below 2 acts as 2 (DeepSpeed: max(2, n)) */
    c = mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LOG, 0.0, 0.2, 1, 0);
    TEST_CHECK(zs_sched_lr(&c, 0, 0) == 0.0 && zs_sched_lr(&c, 0, 1) == 0.0);
    TEST_CHECK(zs_test_close(zs_sched_lr(&c, 0, 2), 0.2, 0, 1e-15, NULL));
    c = mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LINEAR, 0.0, 0.2, 1, 0);
    TEST_CHECK(zs_sched_lr(&c, 0, 2) == 0.1 && zs_sched_lr(&c, 0, 3) == 0.2);

    /* a warmup down (min > max) follows the same formula */
    c = mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LINEAR, 0.5, 0.1, 4, 0);
    TEST_CHECK(zs_test_close(zs_sched_lr(&c, 0, 3), 0.3, 0, 1e-15, NULL));

    /* no schedule: the optimizer's lr, whatever the step */
    c = mk(ZS_SCHED_NONE, ZS_WARMUP_LOG, 0.0, 0.01, 10, 0);
    TEST_CHECK(zs_sched_lr(&c, 3e-4, 0) == 3e-4 && zs_sched_lr(&c, 3e-4, 12345) == 3e-4);
    TEST_CHECK(zs_sched_lr(NULL, 7e-5, 9) == 7e-5);
}

/* ---- DeepSpeed's objects and engine loop, re-enacted ------------------------ */

typedef struct ds_sched {
    int decay; /* WarmupDecayLR */
    double min_lr, delta_lr;
    int64_t warmup_num_steps, total_num_steps;
    int linear;
    double inverse_log_warm_up;
    int64_t last_batch_iteration;
} ds_sched_t;

static double ds_get_gamma(const ds_sched_t *d)
{
    if (d->last_batch_iteration < d->warmup_num_steps) {
        if (!d->linear)
            return d->inverse_log_warm_up * log((double)(d->last_batch_iteration + 1));
        return (double)d->last_batch_iteration / (double)d->warmup_num_steps;
    }
    if (!d->decay)
        return 1.0;
    double den = fmax(1.0, (double)(d->total_num_steps - d->warmup_num_steps));
    return fmax(0.0, (double)(d->total_num_steps - d->last_batch_iteration) / den);
}

static double ds_get_lr(const ds_sched_t *d)
{
    if (d->last_batch_iteration < 0)
        return d->min_lr; /* "before it has started": min_lrs */
    return d->min_lr + d->delta_lr * ds_get_gamma(d);
}

/* __init__: the optimizer's lr is set from get_lr() at iteration -1 */
static double ds_init(ds_sched_t *d, const zs_sched_config_t *c)
{
    d->decay = c->type == ZS_SCHED_WARMUP_DECAY_LR;
    d->min_lr = c->warmup_min_lr;
    d->delta_lr = c->warmup_max_lr - c->warmup_min_lr;
    d->warmup_num_steps = c->warmup_num_steps > 2 ? c->warmup_num_steps : 2;
    d->total_num_steps = c->total_num_steps;
    d->linear = c->warmup_type == ZS_WARMUP_LINEAR;
    d->inverse_log_warm_up = 1.0 / log((double)d->warmup_num_steps);
    d->last_batch_iteration = -1;
    return ds_get_lr(d);
}

static void test_vs_deepspeed(void)
{
    const zs_sched_config_t cases[] = {
        mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LOG, 0.0, 1e-3, 1000, 0),
        mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LOG, 1e-5, 3e-4, 37, 0),
        mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LINEAR, 1e-6, 6e-4, 50, 0),
        mk(ZS_SCHED_WARMUP_LR, ZS_WARMUP_LINEAR, 0.0, 0.1, 1, 0),
        mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LOG, 0.0, 1e-3, 100, 1000),
        mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LINEAR, 2e-5, 2e-4, 64, 640),
        mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LINEAR, 0.0, 1e-3, 100, 30),
        mk(ZS_SCHED_WARMUP_DECAY_LR, ZS_WARMUP_LOG, 1e-4, 1e-3, 2, 3),
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const zs_sched_config_t *c = &cases[k];
        ds_sched_t d;
        double opt_lr = ds_init(&d, c);
        int64_t applied = 0;
        uint32_t rng = 12345u + (uint32_t)k;
        for (int step = 0; step < 3000; step++) {
            /* optimizer.step() runs with opt_lr */
            double ours = zs_sched_lr(c, -1.0, applied);
            TEST_CHECKF(ours == opt_lr, "case %zu step %d (applied %lld): %.17g != DeepSpeed %.17g",
                        k, step, (long long)applied, ours, opt_lr);
            rng = rng * 1664525u + 1013904223u;
            int overflow = (rng >> 24) < 20; /* ~8% of steps overflow (fp16) */
            if (!overflow) {
                d.last_batch_iteration++; /* lr_scheduler.step() */
                opt_lr = ds_get_lr(&d);
                applied++;
            }
        }
    }
}

int main(void)
{
    test_tables();
    test_vs_deepspeed();
    printf("test_sched: ok\n");
    return 0;
}
