/*
 * zs_config_internal.h - what zs_config.c (the section parsers) shares with
 * zs_config_json.c (value helpers, relaxed JSON) and zs_config_unknown.c
 * (unknown keys, suggestions): the parse context, the helpers that read one
 * cJSON value under its dotted path, and the unknown-key record. Not a
 * public header.
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
#define UNKNOWN_MAX  160 /* bytes of the unknown-key list quoted in the error */

/* Parse context: warning sink with de-duplication, the unknown keys seen
 * (refused at the end unless allow_unknown), and the error record. */
typedef struct pctx {
    zs_config_warn_fn warn;
    void *ud;
    zs_err_t *err;
    int allow_unknown;         /* 1: unknown keys are warned about, not refused */
    int nunknown;              /* unknown keys recorded (allow_unknown 0) */
    int unknown_full;          /* unknown[] ran out of room ("..." written) */
    char unknown[UNKNOWN_MAX]; /* "a (did you mean b?), c, ..." */
    int nwarned;
    char warned[WARN_MAX][PATH_MAX_LEN];
} pctx_t;

/* A search for the known key closest to `key` (zs_config_unknown.c). */
typedef struct cfg_near {
    const char *key;  /* the unknown key */
    const char *best; /* closest known key so far, NULL if none is close enough */
    int dist;         /* its edit distance */
} cfg_near_t;

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

/* Start a search for the known key nearest to key (kept by pointer). */
void zs__cfg_near_init(cfg_near_t *n, const char *key);

/* Consider cand (kept by pointer): it becomes the best if strictly closer
 * (case-insensitive edit distance with transpositions, or 1 + the extra
 * '_'-words when one name's words are all in the other, whichever is less)
 * and within a third of the longer name's length, at least 1. */
void zs__cfg_near_add(cfg_near_t *n, const char *cand);

/* zs__cfg_near_add for each entry of a NULL-terminated list (list may be NULL). */
void zs__cfg_near_add_list(cfg_near_t *n, const char *const *list);

/* The key parent.key is unknown; n (may be NULL) holds the suggestion. With
 * c->allow_unknown: warned once ("unknown key (did you mean parent.best?),
 * ignored"); else recorded for zs__cfg_unknown_finish. Returns ZS_OK: the
 * parse goes on, so that one error can name every unknown key. */
int zs__cfg_unknown(pctx_t *c, const char *parent, const char *key, const cfg_near_t *n);

/* zs__cfg_unknown suggesting the nearest of two NULL-terminated lists (known2 may be NULL). */
int zs__cfg_unknown_in(pctx_t *c, const char *parent, const char *key, const char *const *known,
                       const char *const *known2);

/* ZS_ERR_INVALID "unknown key a (did you mean b?), ..." if any unknown key
 * was recorded, else ZS_OK. */
int zs__cfg_unknown_finish(pctx_t *c);

/* The "activation_checkpointing" section o (zs_config_actckpt.c): present
 * (an object) turns act_ckpt on; cpu_checkpointing read; the keys without
 * effect warned once; unknown keys recorded. Errors name the key. */
int zs__cfg_parse_actckpt(pctx_t *c, const cJSON *o, zs_config_t *cfg);

/* A malloc'd strict-JSON copy of the relaxed (hjson-like) text in; NULL if out of memory. */
char *zs__cfg_relax_json(const char *in);

/* zero_optimization.offload_optimizer (param 0) or offload_param (param 1)
 * at path into cfg (zs_config_offload.c): offload_optimizer / offload_param,
 * offload_nvme, offload_param_nvme and its path and buffers, and the
 * speculation switches; ZS_OK or the refusal recorded in c->err. */
int zs__cfg_parse_offload(pctx_t *c, const cJSON *o, const char *path, int param, zs_config_t *cfg);

#endif /* ZS_CONFIG_INTERNAL_H */
