/*
 * zs_gpt_eval.c - the evaluator (zs_gpt_eval.h): a forward-only GPT on its
 * own CPU device for the validation loss and for samples.
 *
 * Not here: the command lines and the reduction over ranks
 * (zs_train_main.c, tools/zs_generate.c).
 */
#include "zs_gpt_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_dev.h"
#include "zs_bpe.h"

struct zs_gpt_eval {
    zs_gpt_config_t c;
    int maxB;
    zs_dev_t *dev;
    zs_stream_t *stream;
    zs_gpt_t *g;
    const zs_model_t *m;
    float *w;      /* device parameters (host RAM on the CPU device) */
    uint64_t *off; /* [nlayers + 1] layer offsets in w */
    int32_t *in, *tg;
    float *logits; /* [T, V] of one sequence */
};

/* A CPU device, its stream, a bound GPT and its parameter buffer (zs_gpt_eval.h). */
int zs_gpt_eval_create(const zs_gpt_config_t *c, int max_batch, zs_gpt_eval_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_gpt_eval_t *ev = calloc(1, sizeof *ev);
    if (!ev)
        return zs_err_set(err, ZS_ERR_NOMEM, "evaluator: out of memory");
    ev->c = *c;
    ev->maxB = max_batch;
    size_t N = (size_t)max_batch * (size_t)c->ctx;
    int rc = zs_dev_cpu_create(1, &ev->dev, err);
    if (!rc)
        rc = zs_dev_stream_create(ev->dev, 0, "eval", &ev->stream, err);
    if (!rc)
        rc = zs_gpt_create(c, max_batch, 0, &ev->g, err);
    if (!rc) {
        ev->m = zs_gpt_model(ev->g);
        rc = ev->m->bind(ev->m->self, ev->dev, ev->stream, err);
    }
    void *p = NULL;
    if (!rc)
        rc = zs_dev_alloc(ev->dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS,
                          zs_gpt_num_params(c) * sizeof(float), &p, err);
    ev->w = p;
    if (!rc) {
        ev->off = calloc((size_t)ev->m->nlayers + 1, sizeof *ev->off);
        ev->in = malloc(N * sizeof *ev->in);
        ev->tg = malloc(N * sizeof *ev->tg);
        ev->logits = malloc((size_t)c->ctx * (size_t)c->vocab * sizeof *ev->logits);
        if (!ev->off || !ev->in || !ev->tg || !ev->logits)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "evaluator: out of memory");
    }
    if (rc) {
        zs_gpt_eval_destroy(ev);
        return rc;
    }
    for (int i = 0; i < ev->m->nlayers; i++)
        ev->off[i + 1] = ev->off[i] + ev->m->nparams[i];
    *out = ev;
    return ZS_OK;
}

/* Free everything (NULL is fine). */
void zs_gpt_eval_destroy(zs_gpt_eval_t *ev)
{
    if (!ev)
        return;
    zs_gpt_destroy(ev->g);
    if (ev->w)
        zs_dev_free(ev->dev, ev->w);
    zs_dev_stream_destroy(ev->stream);
    zs_dev_destroy(ev->dev);
    free(ev->off);
    free(ev->in);
    free(ev->tg);
    free(ev->logits);
    free(ev);
}

/* Copy P floats of parameters in and wait. */
int zs_gpt_eval_set_params(zs_gpt_eval_t *ev, const float *params, zs_err_t *err)
{
    int rc =
        zs_dev_memcpy(ev->stream, ev->w, params, zs_gpt_num_params(&ev->c) * sizeof(float), err);
    return rc ? rc : zs_dev_stream_sync(ev->stream, err);
}

/* Forward of every layer on the tokens set last; *loss if not NULL. */
static int forward(zs_gpt_eval_t *ev, double *loss, zs_err_t *err)
{
    for (int i = 0; i < ev->m->nlayers; i++) {
        void *p[2] = {ev->w + ev->off[i], ev->w}; /* own, then layer 0 (the tied head's dep) */
        int rc = ev->m->forward(ev->m->self, i, p, err);
        if (rc)
            return rc;
    }
    return loss ? ev->m->loss(ev->m->self, loss, err) : zs_dev_stream_sync(ev->stream, err);
}

/* This rank's windows of the validation slice, in micro-batches (zs_gpt_eval.h). */
int zs_gpt_eval_loss(zs_gpt_eval_t *ev, const zs_data_t *val, uint64_t ntokens, int rank, int W,
                     double *sum, uint64_t *positions, zs_err_t *err)
{
    const int T = ev->c.ctx;
    uint64_t n = zs_data_count(val) < ntokens ? zs_data_count(val) : ntokens;
    *sum = 0;
    *positions = 0;
    if (n < (uint64_t)T + 1)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "validation: %llu tokens, fewer than one window of T + 1 = %d",
                          (unsigned long long)n, T + 1);
    uint64_t nwin = (n - 1) / (uint64_t)T;
    uint32_t buf[65537];
    if (T + 1 > 65537)
        return zs_err_set(err, ZS_ERR_RANGE, "validation: T = %d is over 65536", T);
    int B = 0;
    for (uint64_t w = (uint64_t)rank; w < nwin || B > 0; w += (uint64_t)W) {
        if (w < nwin) {
            int rc = zs_data_read(val, w * (uint64_t)T, (uint64_t)T + 1, buf, err);
            if (rc)
                return rc;
            for (int i = 0; i <= T; i++)
                if (buf[i] >= (uint32_t)ev->c.vocab)
                    return zs_err_set(
                        err, ZS_ERR_CORRUPT, "validation data: token %u at %llu is >= vocab %d",
                        buf[i], (unsigned long long)(w * (uint64_t)T + (uint64_t)i), ev->c.vocab);
            for (int i = 0; i < T; i++) {
                ev->in[(size_t)B * T + i] = (int32_t)buf[i];
                ev->tg[(size_t)B * T + i] = (int32_t)buf[i + 1];
            }
            B++;
        }
        if (B == ev->maxB || (w + (uint64_t)W >= nwin && B > 0)) {
            double loss;
            int rc = zs_gpt_set_tokens(ev->g, ev->in, ev->tg, B, T, err);
            if (!rc)
                rc = forward(ev, &loss, err);
            if (rc)
                return rc;
            *sum += loss * B * T;
            *positions += (uint64_t)B * (uint64_t)T;
            B = 0;
        }
    }
    return ZS_OK;
}

/* SplitMix64 step: the next pseudo-random 64 bits of *s. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* One token from logits[V]: greedy, or top-k with temperature. */
static int32_t pick(const float *logits, int V, const zs_gpt_sample_opts_t *o, uint64_t *rng,
                    int *idx, double *prob)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (o->temperature <= 0)
        return best;
    int k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    int n = 0; /* idx[0..n): the n largest so far, in decreasing order */
    for (int v = 0; v < V; v++) {
        int pos;
        if (n < k)
            pos = n++;
        else if (logits[v] > logits[idx[k - 1]])
            pos = k - 1;
        else
            continue;
        while (pos > 0 && logits[v] > logits[idx[pos - 1]]) {
            idx[pos] = idx[pos - 1];
            pos--;
        }
        idx[pos] = v;
    }
    double z = 0;
    for (int i = 0; i < n; i++)
        z += prob[i] = exp((logits[idx[i]] - logits[idx[0]]) / o->temperature);
    double u = (double)(next_rand(rng) >> 11) * 0x1.0p-53 * z;
    for (int i = 0; i < n; i++) {
        u -= prob[i];
        if (u < 0)
            return idx[i];
    }
    return idx[n - 1];
}

/* Continue tok up to `until` tokens, one forward per token (zs_gpt_eval.h). */
int zs_gpt_eval_generate(zs_gpt_eval_t *ev, int32_t *tok, int *n, int until,
                         const zs_gpt_sample_opts_t *o, zs_err_t *err)
{
    const int V = ev->c.vocab;
    if (until > ev->c.ctx)
        until = ev->c.ctx;
    if (*n < 1)
        return zs_err_set(err, ZS_ERR_INVALID, "sample: the prompt has no token");
    int *idx = malloc((size_t)V * sizeof *idx);
    double *prob = malloc((size_t)V * sizeof *prob);
    if (!idx || !prob) {
        free(idx);
        free(prob);
        return zs_err_set(err, ZS_ERR_NOMEM, "sample: out of memory");
    }
    uint64_t rng = o->seed;
    int rc = ZS_OK;
    while (*n < until && rc == ZS_OK) {
        int T = *n; /* causal: the logits at T - 1 need only tokens 0..T-1 */
        for (int i = 0; i < T; i++) {
            ev->in[i] = tok[i];
            ev->tg[i] = 0;
        }
        rc = zs_gpt_set_tokens(ev->g, ev->in, ev->tg, 1, T, err);
        if (!rc)
            rc = forward(ev, NULL, err);
        if (!rc)
            rc = zs_gpt_copy_logits(ev->g, ev->logits, err);
        if (!rc)
            tok[(*n)++] = pick(ev->logits + (size_t)(T - 1) * V, V, o, &rng, idx, prob);
    }
    free(idx);
    free(prob);
    return rc;
}

typedef struct prompt_sink {
    int32_t *tok;
    int n, max;
} prompt_sink_t;

/* zs_bpe_emit_fn: append ids to the prompt (ZS_ERR_RANGE when full). */
static int prompt_emit(void *ctx, const uint32_t *ids, size_t k)
{
    prompt_sink_t *s = ctx;
    for (size_t i = 0; i < k; i++) {
        if (s->n >= s->max)
            return ZS_ERR_RANGE;
        s->tok[s->n++] = (int32_t)ids[i];
    }
    return ZS_OK;
}

/* The ids of a prompt (zs_gpt_eval.h). */
int zs_gpt_eval_prompt(const zs_gpt_config_t *c, zs_bpe_t *bpe, const char *text, int32_t *tok,
                       int *n, int max, zs_err_t *err)
{
    *n = 0;
    if (!text) { /* the default: <|endoftext|>, or a newline byte */
        tok[(*n)++] = bpe && zs_bpe_eot(bpe) >= 0 ? zs_bpe_eot(bpe) : c->vocab == 256 ? '\n' : 0;
        return ZS_OK;
    }
    size_t len = strlen(text);
    if (bpe) {
        prompt_sink_t s = {tok, 0, max};
        size_t used;
        int rc = zs_bpe_encode(bpe, (const uint8_t *)text, len, 1, &used, prompt_emit, &s, err);
        if (rc)
            return zs_err_set(err, rc, "--prompt: more than %d tokens or not encodable", max);
        *n = s.n;
    } else if (c->vocab == 256) {
        if (len > (size_t)max)
            return zs_err_set(err, ZS_ERR_RANGE, "--prompt: %zu bytes, the context is %d", len,
                              max);
        for (size_t i = 0; i < len; i++)
            tok[(*n)++] = (uint8_t)text[i];
    } else {
        return zs_err_set(err, ZS_ERR_INVALID,
                          "--prompt with vocab %d needs --vocab-dir (GPT-2's encoder.json and "
                          "vocab.bpe)",
                          c->vocab);
    }
    return *n > 0 ? ZS_OK : zs_err_set(err, ZS_ERR_INVALID, "--prompt is empty");
}

/* Print ids as text, bytes or numbers (zs_gpt_eval.h). */
void zs_gpt_eval_print(FILE *f, const zs_bpe_t *bpe, int vocab, const int32_t *tok, int n)
{
    for (int i = 0; i < n; i++) {
        const uint8_t *p;
        size_t len;
        if (bpe && zs_bpe_token_bytes(bpe, (uint32_t)tok[i], &p, &len, NULL) == ZS_OK)
            fwrite(p, 1, len, f);
        else if (!bpe && vocab == 256)
            fputc(tok[i], f);
        else
            fprintf(f, "%s%d", i ? " " : "", tok[i]);
    }
}
