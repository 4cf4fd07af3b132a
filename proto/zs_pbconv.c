/*
 * zs_pbconv.c - wire message <-> struct conversions (see zs_pbconv.h).
 */
#include "zs_pbconv.h"

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
