/*
 * zs_ctl_manifest.c - parse and validate the model manifest a checkpoint
 * carries (written by the model, e.g. worker/model/zs_gpt_manifest.c, and
 * stored by the engine after its state in the checkpoint's user_meta):
 *
 *   {"format": "zeroshard-manifest/1", "model": {...}, "storage_dtype": "F32",
 *    "num_params": P, "tensors": [[name, [d0, d1, ...], offset], ...]}
 *
 * The text comes from the servers, so everything is checked before use:
 * sizes, integer-ness of every number, names, overlaps. Does not: read
 * tensors or write files (zs_ctl_export.c does).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_ctl.h"

#define FORMAT "zeroshard-manifest/1"

/* A JSON number that is an integer in [lo, hi] (exact in a double). */
static int int_in(const cJSON *j, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return 0;
    double d = j->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || floor(d) != d || d > 9007199254740992.0)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((zs_ctl_tensor_t *)0)->name))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              strchr("_.:/-", *s)))
            return 0;
    return 1;
}

static int by_offset(const void *a, const void *b)
{
    const zs_ctl_tensor_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const zs_ctl_tensor_t *)a)->name, ((const zs_ctl_tensor_t *)b)->name);
}

/* Tensor k from [name, shape, offset]. */
static int parse_tensor(const cJSON *j, int k, uint64_t P, zs_ctl_tensor_t *t, zs_err_t *err)
{
    const cJSON *nm = cJSON_GetArrayItem(j, 0), *sh = cJSON_GetArrayItem(j, 1),
                *of = cJSON_GetArrayItem(j, 2);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 3 || !cJSON_IsString(nm) ||
        !cJSON_IsArray(sh))
        return zs_err_set(err, ZS_ERR_CORRUPT, "manifest: tensor %d is not [name, shape, offset]",
                          k);
    if (!name_ok(nm->valuestring))
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "manifest: tensor %d has a bad name (want 1..127 of [A-Za-z0-9_.:/-])",
                          k);
    snprintf(t->name, sizeof t->name, "%s", nm->valuestring);
    t->ndim = cJSON_GetArraySize(sh);
    if (t->ndim < 1 || t->ndim > ZS_CTL_MAX_DIMS)
        return zs_err_set(err, ZS_ERR_CORRUPT, "manifest: %s has %d dimensions (1..%d)", t->name,
                          t->ndim, ZS_CTL_MAX_DIMS);
    t->numel = 1;
    int d = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, sh)
    {
        if (!int_in(x, 1, P, &t->shape[d]) || t->shape[d] > P / t->numel)
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "manifest: %s: dimension %d is not an integer in [1, %llu] or the "
                              "shape exceeds the model",
                              t->name, d, (unsigned long long)P);
        t->numel *= t->shape[d++];
    }
    if (!int_in(of, 0, P - 1, &t->offset) || t->numel > P - t->offset)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "manifest: %s: offset not an integer with [offset, offset + %llu) inside "
                          "[0, %llu)",
                          t->name, (unsigned long long)t->numel, (unsigned long long)P);
    return ZS_OK;
}

int zs_ctl_manifest_parse(const char *text, size_t len, uint64_t P, zs_ctl_manifest_t *m,
                          zs_err_t *err)
{
    memset(m, 0, sizeof *m);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root)
        return zs_err_set(err, ZS_ERR_CORRUPT, "manifest: not JSON");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(root, "storage_dtype");
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(root, "num_params");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    uint64_t mp = 0;
    int rc = ZS_OK;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: format is not \"" FORMAT "\"");
    else if (!cJSON_IsObject(model))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: no \"model\" object");
    else if (!cJSON_IsString(sd) || strcmp(sd->valuestring, "F32"))
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: storage_dtype is not \"F32\"");
    else if (!int_in(np, 1, UINT64_MAX, &mp) || mp != P)
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "manifest: num_params is not the checkpoint's %llu parameters",
                        (unsigned long long)P);
    else if (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) < 1 ||
             cJSON_GetArraySize(ts) > ZS_CTL_MAX_TENSORS)
        rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: \"tensors\" is not a list of 1..%d",
                        ZS_CTL_MAX_TENSORS);
    if (!rc) {
        m->n = cJSON_GetArraySize(ts);
        m->t = calloc((size_t)m->n, sizeof *m->t);
        m->model_json = cJSON_PrintUnformatted(model);
        if (!m->t || !m->model_json)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    const cJSON *x;
    if (!rc)
        cJSON_ArrayForEach(x, ts)
        {
            rc = parse_tensor(x, k, P, &m->t[k], err);
            if (rc)
                break;
            k++;
        }
    cJSON_Delete(root);
    if (!rc) { /* unique names */
        qsort(m->t, (size_t)m->n, sizeof *m->t, by_name);
        for (int i = 1; i < m->n && !rc; i++)
            if (!strcmp(m->t[i - 1].name, m->t[i].name))
                rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: tensor %s listed twice",
                                m->t[i].name);
    }
    if (!rc) { /* disjoint */
        qsort(m->t, (size_t)m->n, sizeof *m->t, by_offset);
        for (int i = 1; i < m->n && !rc; i++)
            if (m->t[i - 1].offset + m->t[i - 1].numel > m->t[i].offset)
                rc = zs_err_set(err, ZS_ERR_CORRUPT, "manifest: %s and %s overlap",
                                m->t[i - 1].name, m->t[i].name);
    }
    if (rc)
        zs_ctl_manifest_free(m);
    return rc;
}

void zs_ctl_manifest_free(zs_ctl_manifest_t *m)
{
    free(m->t);
    if (m->model_json)
        cJSON_free(m->model_json);
    memset(m, 0, sizeof *m);
}
