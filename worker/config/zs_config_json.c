/*
 * zs_config_json.c - the value layer of the DeepSpeed config parser: read
 * one cJSON value as a bool, integer, number or string under its dotted key
 * path, with DeepSpeed's messages; warn once per key path; refuse duplicate
 * keys; and turn the relaxed JSON that DeepSpeed (hjson) accepts into strict
 * JSON for cJSON.
 *
 * What it does not do: it knows no DeepSpeed key or default (zs_config.c
 * does), and its relaxed-JSON pass only covers what JSON-looking files use
 * (comments, trailing commas, newline-separated members), not all of hjson
 * (no quoteless strings, no multiline strings).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "zs_config_internal.h"
#include "zs_log.h"

#define VAL_MAX 72 /* bytes of a value quoted in an error message */

/* ---- small helpers ------------------------------------------------------ */

/* "parent.key", or "key" at the top level, truncated to PATH_MAX_LEN. */
void zs__cfg_path_join(char *out, const char *parent, const char *key)
{
    if (parent && parent[0])
        snprintf(out, PATH_MAX_LEN, "%s.%s", parent, key);
    else
        snprintf(out, PATH_MAX_LEN, "%s", key);
}

/* ASCII case-insensitive equality. */
int zs__cfg_ci_equal(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        int ca = (*a >= 'A' && *a <= 'Z') ? *a + 32 : *a;
        int cb = (*b >= 'A' && *b <= 'Z') ? *b + 32 : *b;
        if (ca != cb)
            return 0;
    }
    return *a == *b;
}

/* Whether name is in a NULL-terminated list of names. */
int zs__cfg_in_list(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(name, *list) == 0)
            return 1;
    return 0;
}

/* The JSON text of a value, shortened to fit an error message. */
static const char *vstr(const cJSON *v, char *buf)
{
    char *p = cJSON_PrintUnformatted(v);
    if (!p) {
        snprintf(buf, VAL_MAX, "(unprintable)");
        return buf;
    }
    size_t n = strlen(p);
    if (n < VAL_MAX) {
        memcpy(buf, p, n + 1);
    } else {
        memcpy(buf, p, VAL_MAX - 4);
        memcpy(buf + VAL_MAX - 4, "...", 4);
    }
    cJSON_free(p);
    return buf;
}

/* Warn about a path once per parse: through the caller's callback, else the
 * log. Past WARN_MAX distinct paths, warnings are no longer de-duplicated. */
void zs__cfg_warn_once(pctx_t *c, const char *path, const char *why)
{
    for (int i = 0; i < c->nwarned; i++)
        if (strcmp(c->warned[i], path) == 0)
            return;
    if (c->nwarned < WARN_MAX)
        snprintf(c->warned[c->nwarned++], PATH_MAX_LEN, "%s", path);
    if (c->warn)
        c->warn(c->ud, path, why);
    else
        ZS_WARN("config: %s: %s", path, why);
}

/* zs__cfg_warn_once for parent.key. */
void zs__cfg_warn_key(pctx_t *c, const char *parent, const char *key, const char *why)
{
    char p[PATH_MAX_LEN];
    zs__cfg_path_join(p, parent, key);
    zs__cfg_warn_once(c, p, why);
}

static int is_auto(const cJSON *v)
{
    return cJSON_IsString(v) && v->valuestring && strcmp(v->valuestring, "auto") == 0;
}

static int err_auto(pctx_t *c, const char *path)
{
    return zs_err_set(c->err, ZS_ERR_INVALID,
                      "%s: \"auto\" is a placeholder that the Hugging Face Trainer/Accelerate "
                      "replaces before DeepSpeed reads the config; zeroshard reads the file "
                      "as it is: write the actual value",
                      path);
}

/* Refuse a value of the wrong type (ZS_ERR_INVALID), or "auto" with its
 * explanation; returns the code. */
int zs__cfg_err_type(pctx_t *c, const cJSON *v, const char *path, const char *what)
{
    char b[VAL_MAX];
    if (is_auto(v))
        return err_auto(c, path);
    return zs_err_set(c->err, ZS_ERR_INVALID, "%s: expected %s, got %s", path, what, vstr(v, b));
}

/* Refuse a value outside its range (ZS_ERR_RANGE); returns the code. */
int zs__cfg_err_value(pctx_t *c, const cJSON *v, const char *path, const char *rule)
{
    char b[VAL_MAX];
    return zs_err_set(c->err, ZS_ERR_RANGE, "%s: %s %s", path, vstr(v, b), rule);
}

/* true/false (or 0/1, which DeepSpeed's pydantic models also take). */
int zs__cfg_get_bool(pctx_t *c, const cJSON *v, const char *path, int *out)
{
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        return ZS_OK;
    }
    if (cJSON_IsNumber(v) && (v->valuedouble == 0.0 || v->valuedouble == 1.0)) {
        *out = v->valuedouble != 0.0;
        return ZS_OK;
    }
    return zs__cfg_err_type(c, v, path, "true or false");
}

/* An integral JSON number (5e8 is fine, 1.5 is not) within [lo, hi]. */
int zs__cfg_get_int(pctx_t *c, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                    int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return zs__cfg_err_type(c, v, path, "an integer");
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < -9.0e18 || d > 9.0e18)
        return zs__cfg_err_type(c, v, path, "an integer");
    int64_t x = (int64_t)d;
    if (x < lo || x > hi) {
        char rule[96];
        if (hi >= INT64_MAX / 4)
            snprintf(rule, sizeof rule, "must be >= %lld", (long long)lo);
        else
            snprintf(rule, sizeof rule, "must be between %lld and %lld", (long long)lo,
                     (long long)hi);
        return zs__cfg_err_value(c, v, path, rule);
    }
    *out = x;
    return ZS_OK;
}

/* zs__cfg_get_int into an int; [lo, hi] lies within int's range. */
int zs__cfg_get_int32(pctx_t *c, const cJSON *v, const char *path, int64_t lo, int64_t hi, int *out)
{
    int64_t x;
    int rc = zs__cfg_get_int(c, v, path, lo, hi, &x);
    if (rc == ZS_OK)
        *out = (int)x;
    return rc;
}

/* A finite JSON number. */
int zs__cfg_get_num(pctx_t *c, const cJSON *v, const char *path, double *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return zs__cfg_err_type(c, v, path, "a number");
    *out = v->valuedouble;
    return ZS_OK;
}

/* A finite JSON number >= lo, or > lo when lo_open. */
int zs__cfg_get_num_min(pctx_t *c, const cJSON *v, const char *path, double lo, int lo_open,
                        double *out)
{
    double d = 0.0;
    int rc = zs__cfg_get_num(c, v, path, &d);
    if (rc != ZS_OK)
        return rc;
    if (lo_open ? !(d > lo) : !(d >= lo)) {
        char rule[64];
        snprintf(rule, sizeof rule, "must be %s %g", lo_open ? ">" : ">=", lo);
        return zs__cfg_err_value(c, v, path, rule);
    }
    *out = d;
    return ZS_OK;
}

/* A JSON string; *out points into v. */
int zs__cfg_get_string(pctx_t *c, const cJSON *v, const char *path, const char **out)
{
    if (!cJSON_IsString(v) || !v->valuestring)
        return zs__cfg_err_type(c, v, path, "a string");
    *out = v->valuestring;
    return ZS_OK;
}

/* Refuse anything but a JSON object. */
int zs__cfg_expect_object(pctx_t *c, const cJSON *v, const char *path)
{
    if (cJSON_IsObject(v))
        return ZS_OK;
    return zs__cfg_err_type(c, v, path, "an object");
}

/* DeepSpeed loads config files with object_pairs_hook =
 * dict_raise_error_on_duplicate_keys: a key given twice is an error. */
int zs__cfg_check_duplicates(pctx_t *c, const cJSON *o, const char *path)
{
    for (const cJSON *a = o->child; a; a = a->next) {
        char p[PATH_MAX_LEN];
        if (cJSON_IsObject(o) && a->string) {
            for (const cJSON *b = a->next; b; b = b->next)
                if (b->string && strcmp(a->string, b->string) == 0) {
                    zs__cfg_path_join(p, path, a->string);
                    return zs_err_set(c->err, ZS_ERR_INVALID,
                                      "%s: duplicate key (DeepSpeed refuses duplicate keys)", p);
                }
            zs__cfg_path_join(p, path, a->string);
        } else {
            snprintf(p, sizeof p, "%s[]", path);
        }
        if (cJSON_IsObject(a) || cJSON_IsArray(a)) {
            int rc = zs__cfg_check_duplicates(c, a, p);
            if (rc != ZS_OK)
                return rc;
        }
    }
    return ZS_OK;
}

/* ---- relaxed JSON (the part of hjson that JSON-looking files use) -------- */

/* Copy `in` to a new string that strict JSON accepts: comments removed
 * (newlines kept, so line numbers stay right), trailing commas before } or ]
 * blanked, and a comma inserted where a value ends and, after a newline, the
 * next value or member begins. Strict JSON comes out unchanged. */
char *zs__cfg_relax_json(const char *in)
{
    size_t n = strlen(in);
    char *out = malloc(2 * n + 2);
    if (!out)
        return NULL;
    size_t o = 0;
    int after_value = 0;  /* the last significant token ended a value */
    int newline_seen = 0; /* a newline since that value */
    long comma_at = -1;   /* output index of a comma not yet followed by a token */
    size_t i = 0;
    while (i < n) {
        char ch = in[i];
        if (ch == '\n') {
            out[o++] = ch;
            i++;
            if (after_value)
                newline_seen = 1;
            continue;
        }
        if (ch == ' ' || ch == '\t' || ch == '\r') {
            out[o++] = ch;
            i++;
            continue;
        }
        if (ch == '#' || (ch == '/' && i + 1 < n && in[i + 1] == '/')) {
            while (i < n && in[i] != '\n')
                i++;
            continue;
        }
        if (ch == '/' && i + 1 < n && in[i + 1] == '*') {
            i += 2;
            while (i < n && !(in[i] == '*' && i + 1 < n && in[i + 1] == '/')) {
                if (in[i] == '\n') {
                    out[o++] = '\n';
                    if (after_value)
                        newline_seen = 1;
                }
                i++;
            }
            i = i + 2 <= n ? i + 2 : n;
            continue;
        }
        /* a significant character */
        if ((ch == '}' || ch == ']') && comma_at >= 0)
            out[comma_at] = ' ';
        comma_at = -1;
        int starts_value = ch == '"' || ch == '{' || ch == '[' || ch == '-' ||
                           (ch >= '0' && ch <= '9') || ch == 't' || ch == 'f' || ch == 'n';
        if (starts_value && after_value && newline_seen)
            out[o++] = ',';
        after_value = 0;
        newline_seen = 0;
        if (ch == '"') {
            out[o++] = in[i++];
            while (i < n && in[i] != '"') {
                if (in[i] == '\\' && i + 1 < n)
                    out[o++] = in[i++];
                out[o++] = in[i++];
            }
            if (i < n)
                out[o++] = in[i++];
            after_value = 1;
        } else if (ch == '}' || ch == ']') {
            out[o++] = in[i++];
            after_value = 1;
        } else if (ch == ',') {
            comma_at = (long)o;
            out[o++] = in[i++];
        } else if (ch == '{' || ch == '[' || ch == ':') {
            out[o++] = in[i++];
        } else if (ch == '-' || ch == '+' || ch == '.' || ch == '_' || (ch >= '0' && ch <= '9') ||
                   (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
            /* a number or a literal (true, false, null; anything else is
             * left for cJSON to refuse) */
            while (i < n && (in[i] == '-' || in[i] == '+' || in[i] == '.' || in[i] == '_' ||
                             (in[i] >= '0' && in[i] <= '9') || (in[i] >= 'a' && in[i] <= 'z') ||
                             (in[i] >= 'A' && in[i] <= 'Z')))
                out[o++] = in[i++];
            after_value = 1;
        } else {
            out[o++] = in[i++]; /* not JSON: cJSON reports it */
        }
    }
    out[o] = '\0';
    return out;
}
