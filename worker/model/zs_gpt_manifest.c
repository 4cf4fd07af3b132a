/*
 * zs_gpt_manifest.c - the GPT's model manifest (zs_gpt.h, zs_gpt_manifest):
 * JSON text the engine stores with every checkpoint so that zs-ctl export
 * writes the model's tensors without model code.
 *
 *   {"format": "zeroshard-manifest/1",
 *    "model": {"name": "zs-gpt", "kind": "gpt2",
 *              "config": {"n_layer": L, "n_head": NH, "n_embd": C,
 *                         "n_positions": T, "vocab_size": V, ...},
 *              "tokenizer": {"type": "gpt2-bpe", "vocab_dir": DIR,
 *                            "encoder_xxh3": HEX, "merges_xxh3": HEX}},
 *    "storage_dtype": "F32", "num_params": P,
 *    "tensors": [["transformer.wte.weight", [V, C], 0], ...]}
 *
 * Each tensor is [name, shape, flat offset] in flat-buffer order
 * (zs_gpt_tensor); its elements are row-major at [offset, offset + numel)
 * of the flat fp32 space the servers hold. Names are Hugging Face's GPT-2
 * (GPT2LMHeadModel's state dict): its Conv1D weights are [in, out] like
 * ours, so no tensor is transposed; the LM head is tied to wte and not
 * listed (lm_head.weight is tied on load). Arrays instead of objects keep
 * the text small (about 55 bytes a tensor: GPT-2 XL's 48 layers give 32 KB,
 * within a checkpoint's 60 KiB of user_meta; about 90 layers fit).
 * "tokenizer" is there when the training data records its GPT-2 vocabulary
 * (zs_data_bpe: zs-tokenize --gpt2), so the export names it and
 * zs-generate decodes without being told (zs_init_from_bpe).
 *
 * Does not: know about checkpoints or files (the engine and zs-ctl do).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_gpt.h"
#include "zs_strbuf.h"

/* Hugging Face GPT-2 name of zs_gpt_tensor's block parameter k (0..11). */
static const char *const k_block_names[12] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

int zs_gpt_manifest(const zs_gpt_config_t *c, const char *name, char **out, zs_err_t *err)
{
    return zs_gpt_manifest_bpe(c, name, NULL, out, err);
}

int zs_gpt_manifest_bpe(const zs_gpt_config_t *c, const char *name, const zs_data_bpe_t *bpe,
                        char **out, zs_err_t *err)
{
    *out = NULL;
    if (c->layers < 1 || c->heads < 1 || c->width < 1 || c->ctx < 1 || c->vocab < 1 ||
        c->width % c->heads)
        return zs_err_set(err, ZS_ERR_INVALID, "GPT config L=%d H=%d C=%d T=%d V=%d is not valid",
                          c->layers, c->heads, c->width, c->ctx, c->vocab);
    if (!name)
        name = "zs-gpt";
    for (const char *s = name; *s; s++) /* it goes into JSON unescaped */
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20)
            return zs_err_set(err, ZS_ERR_INVALID, "model name '%s' cannot go into JSON", name);
    zs_strbuf_t b = {0};
    zs_strbuf_addf(
        &b,
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{\"name\":\"%s\",\"kind\":\"gpt2\","
        "\"config\":{\"n_layer\":%d,\"n_head\":%d,\"n_embd\":%d,\"n_positions\":%d,"
        "\"vocab_size\":%d,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
        "\"tie_word_embeddings\":true}",
        name, c->layers, c->heads, c->width, c->ctx, c->vocab);
    if (bpe) { /* inside "model": zs-ctl export copies that object into its metadata */
        zs_strbuf_addf(&b, ",\"tokenizer\":{\"type\":\"gpt2-bpe\",\"vocab_dir\":");
        zs_strbuf_add_json_string(&b, bpe->dir);
        zs_strbuf_addf(&b, ",\"encoder_xxh3\":\"%016llx\",\"merges_xxh3\":\"%016llx\"}",
                       (unsigned long long)bpe->encoder_xxh3, (unsigned long long)bpe->merges_xxh3);
    }
    zs_strbuf_addf(&b, "},\"storage_dtype\":\"F32\",\"num_params\":%llu,\"tensors\":[",
                   (unsigned long long)zs_gpt_num_params(c));
    int n = zs_gpt_num_tensors(c);
    for (int i = 0; i < n && !b.oom; i++) {
        zs_gpt_tensor_t t;
        zs_gpt_tensor(c, i, &t);
        char hf[64];
        if (i == 0 || i == 1)
            snprintf(hf, sizeof hf, "transformer.%s.weight", i == 0 ? "wte" : "wpe");
        else if (i < n - 2)
            snprintf(hf, sizeof hf, "transformer.h.%d.%s", (i - 2) / 12,
                     k_block_names[(i - 2) % 12]);
        else
            snprintf(hf, sizeof hf, "transformer.ln_f.%s", i == n - 2 ? "weight" : "bias");
        if (t.rows == 1)
            zs_strbuf_addf(&b, "%s[\"%s\",[%llu],%llu]", i ? "," : "", hf,
                           (unsigned long long)t.cols, (unsigned long long)t.offset);
        else
            zs_strbuf_addf(&b, "%s[\"%s\",[%llu,%llu],%llu]", i ? "," : "", hf,
                           (unsigned long long)t.rows, (unsigned long long)t.cols,
                           (unsigned long long)t.offset);
    }
    zs_strbuf_addf(&b, "]}");
    if (b.oom) {
        free(b.p);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for the model manifest");
    }
    *out = b.p;
    return ZS_OK;
}
