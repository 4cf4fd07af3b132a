/*
 * zs_generate.c - zs-generate: text from a GPT-2 weights file on the CPU.
 *
 *   zs-generate --model F [--vocab-dir DIR] [--prompt TEXT | --prompt-ids
 *               1,2,3] [--tokens N] [--top-k K] [--temperature X]
 *               [--seed S] [--heads H] [--ids]
 *
 * F is what `zs-train --init-from` reads (worker/model/zs_init_from.h): a
 * Hugging Face GPT-2 safetensors file (zs-ctl export writes one) or an
 * llm.c checkpoint. The model is the fp32 CPU reference GPT
 * (worker/model/zs_gpt_eval.h, the code zs-train's --sample-every uses),
 * with the file's context. The prompt is encoded with the GPT-2 vocabulary
 * of --vocab-dir, else the one the file's metadata names (zs-ctl export of
 * a run on zs-tokenize --gpt2 data: zs_init_from_bpe; refused with a
 * warning, ids printed, when that folder's files changed), else as bytes
 * for vocab 256 (ids for other vocabularies); the default prompt is
 * <|endoftext|> (or "\n"). Output: the prompt and its continuation as text,
 * or with --ids the ids, one line, space-separated. --temperature 0 is
 * greedy decoding. Exit 0, 1 (a file or the model failed), 2 (usage).
 *
 * Not here: loading weights (zs_init_from.c), the model (zs_gpt_eval.c).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_bpe.h"
#include "zs_gpt_eval.h"
#include "zs_init_from.h"

/* The --help text. */
static void usage(FILE *f)
{
    fprintf(f, "usage: zs-generate --model F [options]\n"
               "  --model F          Hugging Face GPT-2 safetensors (zs-ctl export) or llm.c\n"
               "                     checkpoint\n"
               "  --vocab-dir DIR    GPT-2's encoder.json and vocab.bpe (prompt and output;\n"
               "                     default: the one F's metadata names, if any)\n"
               "  --prompt TEXT      default: <|endoftext|> (bytes: a newline)\n"
               "  --prompt-ids LIST  the prompt as ids, comma-separated\n"
               "  --tokens N         tokens to generate (default 64; the context bounds it)\n"
               "  --top-k K          default 40 (0: all)\n"
               "  --temperature X    default 1 (0: greedy)\n"
               "  --seed S           default 1337\n"
               "  --heads H          attention heads when the file does not say (default\n"
               "                     width / 64)\n"
               "  --ids              print ids instead of text\n");
}

/* zs-generate entry point: 0, 1 (failure, message printed) or 2 (usage). */
int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"model", 1, 0, 'm'},       {"vocab-dir", 1, 0, 'v'}, {"prompt", 1, 0, 'p'},
        {"prompt-ids", 1, 0, 'P'},  {"tokens", 1, 0, 'n'},    {"top-k", 1, 0, 'k'},
        {"temperature", 1, 0, 't'}, {"seed", 1, 0, 's'},      {"heads", 1, 0, 'H'},
        {"ids", 0, 0, 'i'},         {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
    const char *model = NULL, *vocab_dir = NULL, *prompt = NULL, *prompt_ids = NULL;
    int tokens = 64, heads = 0, ids = 0, ch;
    zs_gpt_sample_opts_t so = {40, 1.0, 1337};
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'm':
            model = optarg;
            break;
        case 'v':
            vocab_dir = optarg;
            break;
        case 'p':
            prompt = optarg;
            break;
        case 'P':
            prompt_ids = optarg;
            break;
        case 'n':
            tokens = atoi(optarg);
            break;
        case 'k':
            so.top_k = atoi(optarg);
            break;
        case 't':
            so.temperature = atof(optarg);
            break;
        case 's':
            so.seed = strtoull(optarg, NULL, 10);
            break;
        case 'H':
            heads = atoi(optarg);
            break;
        case 'i':
            ids = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!model || optind < argc || tokens < 1 || so.top_k < 0 || !(so.temperature >= 0) ||
        heads < 0 || (prompt && prompt_ids)) {
        fprintf(stderr, "zs-generate: %s\n",
                !model ? "--model is required" : "bad arguments (--help for usage)");
        return 2;
    }
    zs_err_t err;
    zs_init_from_t *f = NULL;
    zs_bpe_t *bpe = NULL;
    zs_gpt_eval_t *ev = NULL;
    float *flat = NULL;
    int32_t *tok = NULL;
    int status = 1;
    if (zs_init_from_load(model, &f, &err) || (vocab_dir && zs_bpe_load(vocab_dir, &bpe, &err)))
        goto out;
    const zs_data_bpe_t *rec = zs_init_from_bpe(f);
    if (!vocab_dir && rec) { /* the training data's vocabulary, named by the export */
        zs_err_t berr;
        if (zs_data_bpe_load(rec, &bpe, &berr) == ZS_OK)
            fprintf(stderr, "zs-generate: vocab: GPT-2 BPE of %s (recorded in %s)\n", rec->dir,
                    model);
        else
            fprintf(stderr,
                    "zs-generate: warning: %s names the vocabulary %s: %s; printing ids "
                    "(--vocab-dir DIR decodes)\n",
                    model, rec->dir, berr.msg);
    }
    zs_gpt_config_t c = {1, heads ? heads : 1, 1, 1, 1};
    if (zs_init_from_settle(f, &c, 0, 0, heads != 0, 0, (uint32_t)zs_init_from_shape(f).vocab,
                            &err))
        goto out;
    uint64_t P = zs_gpt_num_params(&c);
    flat = malloc(P * sizeof *flat);
    tok = malloc((size_t)c.ctx * sizeof *tok);
    if (!flat || !tok) {
        zs_err_set(&err, ZS_ERR_NOMEM, "out of memory for %llu parameters", (unsigned long long)P);
        goto out;
    }
    for (int i = 0; i < zs_gpt_num_tensors(&c); i++) {
        zs_gpt_tensor_t t;
        zs_gpt_tensor(&c, i, &t);
        if (zs_init_from_tensor(f, &c, i, flat + t.offset, &err))
            goto out;
    }
    if (zs_gpt_eval_create(&c, 1, &ev, &err) || zs_gpt_eval_set_params(ev, flat, &err))
        goto out;
    int n = 0;
    if (prompt_ids) {
        for (const char *s = prompt_ids; *s && n < c.ctx;) {
            char *e;
            long v = strtol(s, &e, 10);
            if (e == s || v < 0 || v >= c.vocab) {
                zs_err_set(&err, ZS_ERR_INVALID, "--prompt-ids: not ids below %d: %s", c.vocab,
                           prompt_ids);
                goto out;
            }
            tok[n++] = (int32_t)v;
            s = *e == ',' ? e + 1 : e;
        }
    } else if (zs_gpt_eval_prompt(&c, bpe, prompt, tok, &n, c.ctx, &err)) {
        goto out;
    }
    if (zs_gpt_eval_generate(ev, tok, &n, n + tokens, &so, &err))
        goto out;
    if (ids) {
        for (int i = 0; i < n; i++)
            printf("%s%d", i ? " " : "", tok[i]);
    } else {
        zs_gpt_eval_print(stdout, bpe, c.vocab, tok, n);
    }
    printf("\n");
    status = 0;
out:
    if (status)
        fprintf(stderr, "zs-generate: %s\n", err.msg);
    zs_gpt_eval_destroy(ev);
    zs_bpe_free(bpe);
    zs_init_from_free(f);
    free(flat);
    free(tok);
    return status;
}
