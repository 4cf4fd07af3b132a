/*
 * zs_config_internal.h - what zs_config.c (the section parsers) shares with
 * zs_config_json.c (value helpers, relaxed JSON): the parse context and the
 * helpers that read one cJSON value under its dotted path. Not a public
 * header.
 *
 * Every zs__cfg_get_* and zs__cfg_err_* helper records its refusal in c->err
 * (through zs_err_set) and returns that code; on success it returns ZS_OK and
 * writes *out, which it never touches on a refusal. Paths are the dotted key
 * path used in every message ("zero_optimization.stage").
 */
#ifndef ZS_CONFIG_INTERNAL_H
#define ZS_CONFIG_INTERNAL_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "zs_config.h"

#define PATH_MAX_LEN 192 /* bytes of a dotted key path, NUL included */
#define WARN_MAX     256 /* distinct warned paths remembered per parse */

/* Parse context: warning sink with de-duplication, and the error record. */
typedef struct pctx {
    zs_config_warn_fn warn;
    void *ud;
    zs_err_t *err;
    int nwarned;
    char warned[WARN_MAX][PATH_MAX_LEN];
} pctx_t;

/* Write "parent.key" (just "key" if parent is NULL or "") to out (PATH_MAX_LEN bytes, truncated).
 */
void zs__cfg_path_join(char *out, const char *parent, const char *key);

/* 1 if a and b are equal ignoring ASCII case, else 0. */
int zs__cfg_ci_equal(const char *a, const char *b);

/* 1 if name is one of the NULL-terminated list, else 0. */
int zs__cfg_in_list(const char *name, const char *const *list);

/* Report "path: why" through c->warn (ZS_WARN without one), at most once per path per parse. */
void zs__cfg_warn_once(pctx_t *c, const char *path, const char *why);

/* zs__cfg_warn_once for the path parent.key. */
void zs__cfg_warn_key(pctx_t *c, const char *parent, const char *key, const char *why);

/* ZS_ERR_INVALID "path: expected <what>, got <v>" (the "auto" explanation for "auto"). */
int zs__cfg_err_type(pctx_t *c, const cJSON *v, const char *path, const char *what);

/* ZS_ERR_RANGE "path: <v> <rule>". */
int zs__cfg_err_value(pctx_t *c, const cJSON *v, const char *path, const char *rule);

/* true/false, or 0/1 as DeepSpeed's pydantic models take, into *out as 1/0. */
int zs__cfg_get_bool(pctx_t *c, const cJSON *v, const char *path, int *out);

/* An integral number (5e8 yes, 1.5 no) in [lo, hi]; ZS_ERR_RANGE outside it. */
int zs__cfg_get_int(pctx_t *c, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                    int64_t *out);

/* zs__cfg_get_int into an int; [lo, hi] must lie within int's range. */
int zs__cfg_get_int32(pctx_t *c, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                      int *out);

/* A finite number. */
int zs__cfg_get_num(pctx_t *c, const cJSON *v, const char *path, double *out);

/* A finite number >= lo (> lo if lo_open); ZS_ERR_RANGE below it. */
int zs__cfg_get_num_min(pctx_t *c, const cJSON *v, const char *path, double lo, int lo_open,
                        double *out);

/* A string; *out points into v (valid while the cJSON tree lives). */
int zs__cfg_get_string(pctx_t *c, const cJSON *v, const char *path, const char **out);

/* ZS_OK if v is an object, else ZS_ERR_INVALID "path: expected an object, got ...". */
int zs__cfg_expect_object(pctx_t *c, const cJSON *v, const char *path);

/* ZS_ERR_INVALID naming the first key given twice in any object under o (path "" = root). */
int zs__cfg_check_duplicates(pctx_t *c, const cJSON *o, const char *path);

/* A malloc'd strict-JSON copy of the relaxed (hjson-like) text in; NULL if out of memory. */
char *zs__cfg_relax_json(const char *in);

#endif /* ZS_CONFIG_INTERNAL_H */
