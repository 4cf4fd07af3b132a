/*
 * zs_gpt_decay.c - which GPT parameters take weight decay: the parameter
 * groups (kernels/zs_adam_groups.h) for zs-train --decay.
 *
 *   all     every parameter (AdamW's plain definition; no groups)
 *   2d      the 2-D tensors only: the embeddings wte, wpe and the blocks'
 *           matmul weights; no decay on biases and LayerNorm weights
 *           (nanoGPT's configure_optimizers, llm.c's train_gpt2.cu)
 *   matmul  the blocks' matmul weights only (qkv_w, attn_proj_w, fc_w,
 *           fc_proj_w): no decay on biases, norms or embeddings
 *
 * One range per run of consecutive tensors with the same decay, lr index 0
 * (one learning rate for all). Does not: decide the decay value (the
 * optimizer's weight_decay) or apply it (the engine and the servers do).
 */
#include <stdlib.h>
#include <string.h>

#include "zs_gpt.h"

int zs_gpt_decay_parse(const char *s, zs_gpt_decay_t *out)
{
    static const char *const names[] = {"all", "2d", "matmul"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (zs_gpt_decay_t)i;
            return ZS_OK;
        }
    return ZS_ERR_INVALID;
}

/* Does tensor t take weight decay under mode? */
static int decays(const zs_gpt_tensor_t *t, zs_gpt_decay_t mode)
{
    int matrix = t->rows > 1 && t->cols > 1;
    if (mode == ZS_GPT_DECAY_2D)
        return matrix;
    int embedding = !strcmp(t->name, "wte") || !strcmp(t->name, "wpe");
    return matrix && !embedding;
}

int zs_gpt_decay_groups(const zs_gpt_config_t *c, zs_gpt_decay_t mode, float weight_decay,
                        zs_group_range_t **out, size_t *n, zs_err_t *err)
{
    *out = NULL;
    *n = 0;
    if (mode == ZS_GPT_DECAY_ALL)
        return ZS_OK;
    if (mode != ZS_GPT_DECAY_2D && mode != ZS_GPT_DECAY_MATMUL)
        return zs_err_set(err, ZS_ERR_INVALID, "unknown weight-decay mode %d", (int)mode);
    int nt = zs_gpt_num_tensors(c);
    zs_group_range_t *r = malloc((size_t)nt * sizeof *r);
    if (!r)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %d parameter group ranges", nt);
    size_t k = 0;
    uint64_t end = 0;
    for (int i = 0; i < nt; i++) {
        zs_gpt_tensor_t t;
        zs_gpt_tensor(c, i, &t);
        if (t.offset != end) { /* the flat order is the tensor order: a bug otherwise */
            free(r);
            return zs_err_set(err, ZS_ERR_INTERNAL, "GPT tensor %s at %llu, expected %llu", t.name,
                              (unsigned long long)t.offset, (unsigned long long)end);
        }
        end = t.offset + t.numel;
        float wd = decays(&t, mode) ? weight_decay : 0.0f;
        if (k && r[k - 1].weight_decay == wd)
            r[k - 1].end = end; /* the same decay as the previous run: extend it */
        else
            r[k++] = (zs_group_range_t){end, wd, 0};
    }
    if (k > ZS_GROUPS_MAX_RANGES) {
        free(r);
        return zs_err_set(err, ZS_ERR_RANGE,
                          "%zu weight-decay ranges for %d layers, more than the %d a model may "
                          "have: use --decay all",
                          k, c->layers, ZS_GROUPS_MAX_RANGES);
    }
    *out = r;
    *n = k;
    return ZS_OK;
}
