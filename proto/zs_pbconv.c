/*
 * zs_pbconv.c - wire message <-> struct conversions (see zs_pbconv.h).
 */
#include "zs_pbconv.h"

#include <stdlib.h>

void zs_pb_adam_set(Zeroshard__AdamConfig *a, const zs_adam_hparams_t *hp)
{
    zeroshard__adam_config__init(a);
    a->lr = hp->lr;
    a->beta1 = hp->beta1;
    a->beta2 = hp->beta2;
    a->eps = hp->eps;
    a->weight_decay = hp->weight_decay;
    a->adam_w_mode = hp->adam_w_mode != 0;
    a->bias_correction = hp->bias_correction != 0;
}

void zs_pb_adam_get(const Zeroshard__AdamConfig *a, zs_adam_hparams_t *hp)
{
    hp->lr = a->lr;
    hp->beta1 = a->beta1;
    hp->beta2 = a->beta2;
    hp->eps = a->eps;
    hp->weight_decay = a->weight_decay;
    hp->adam_w_mode = a->adam_w_mode;
    hp->bias_correction = a->bias_correction;
}

int zs_pb_groups_set(const zs_group_range_t *r, size_t n, Zeroshard__GroupRange ***out)
{
    *out = NULL;
    if (n == 0)
        return ZS_OK;
    Zeroshard__GroupRange **p = malloc(n * sizeof *p);
    Zeroshard__GroupRange *m = malloc(n * sizeof *m);
    if (!p || !m) {
        free(p);
        free(m);
        return ZS_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        zeroshard__group_range__init(&m[i]);
        m[i].end = r[i].end;
        m[i].weight_decay = r[i].weight_decay;
        m[i].lr_index = r[i].lr_index;
        p[i] = &m[i];
    }
    *out = p;
    return ZS_OK;
}

void zs_pb_groups_free(Zeroshard__GroupRange **g)
{
    if (g) {
        free(g[0]); /* the block of messages */
        free(g);
    }
}

int zs_pb_groups_get(Zeroshard__GroupRange *const *g, size_t n, zs_group_range_t *r,
                     zs_err_t *err)
{
    if (n > ZS_GROUPS_MAX_RANGES)
        return zs_err_set(err, ZS_ERR_INVALID, "%zu parameter group ranges, at most %d", n,
                          ZS_GROUPS_MAX_RANGES);
    for (size_t i = 0; i < n; i++) {
        r[i].end = g[i]->end;
        r[i].weight_decay = g[i]->weight_decay;
        r[i].lr_index = g[i]->lr_index;
    }
    return ZS_OK;
}
