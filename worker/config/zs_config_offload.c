/*
 * zs_config_offload.c - zero_optimization.offload_optimizer and
 * zero_optimization.offload_param of a DeepSpeed config: the device
 * (none|cpu|nvme), zeroshard's speculation and streaming switches, the NVMe
 * keys (honoured for offload_param, read with no effect for
 * offload_optimizer, whose state lives under each server's --nvme-path),
 * and the keys recognised but not implemented.
 *
 * What it does not do: cross-check the offload with the stage or the
 * servers (zs_config_resolve.c and the engine do), read other sections.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zs_config_internal.h"

static const char *const OFFLOAD_KEYS[] = {"device",      "nvme_path",  "buffer_count",
                                           "buffer_size", "max_in_cpu", NULL};
static const char *const OFFLOAD_OPT_KEYS[] = {
    "device",       "super_offload",        "speculate_every_step",
    "stream_pulls", "delayed_update_after", NULL};

static const char *const OFFLOAD_OPT_NOT_IMPLEMENTED[] = {
    "nvme_path", "buffer_count", "pin_memory",          "pipeline_read",      "pipeline_write",
    "fast_init", "ratio",        "convert_grad_on_cpu", "cpuadam_cores_perc", NULL};

/* DeepSpeed's NVMe keys of offload_optimizer, read and warned about once:
 * the servers' NVMe tier (zs-server --nvme-path, docs/nvme.md) decides. */
static const char *const OFFLOAD_OPT_NVME_NO_EFFECT[][2] = {
    {"nvme_path", "no effect: the state lives under each server's --nvme-path"},
    {"buffer_count", "no effect: zs-server --nvme-buffers sets the tiles in flight"},
    {"pin_memory", "no effect: the servers' tile buffers are aligned for O_DIRECT"},
    {"pipeline_read", "no effect: the servers always read tiles ahead of the update"},
    {"pipeline_write", "no effect: the servers always write tiles behind the update"},
    {"fast_init", "no effect: Initialize streams the master weights into the tiles once"},
    {NULL, NULL}};

static const char *const OFFLOAD_PARAM_NOT_IMPLEMENTED[] = {"pin_memory", NULL};

/* offload_param's NVMe keys (read with any device; used with "nvme"). */
static const char *const OFFLOAD_PARAM_NVME_KEYS[] = {"nvme_path", "buffer_count", "buffer_size",
                                                      "max_in_cpu", NULL};

/* Why an NVMe key of offload_optimizer changes nothing, or NULL. */
static const char *nvme_no_effect(const char *key)
{
    for (int i = 0; OFFLOAD_OPT_NVME_NO_EFFECT[i][0]; i++)
        if (strcmp(key, OFFLOAD_OPT_NVME_NO_EFFECT[i][0]) == 0)
            return OFFLOAD_OPT_NVME_NO_EFFECT[i][1];
    return NULL;
}

/* offload_param's nvme_path, buffer_count, buffer_size, max_in_cpu (kind:
 * 0..3 in that order) into cfg; warned about as having no effect unless the
 * device is "nvme" (nvme: known once the whole object is read). */
static int parse_param_nvme_key(pctx_t *c, const cJSON *it, const char *p, int kind,
                                zs_config_t *cfg)
{
    int rc;
    if (kind == 0) {
        const char *s = "";
        if ((rc = zs__cfg_get_string(c, it, p, &s)) != ZS_OK)
            return rc;
        if (!s[0] || strlen(s) >= sizeof cfg->offload_param_nvme_path)
            return zs__cfg_err_value(c, it, p, "must be a directory path of 1 to 511 bytes");
        snprintf(cfg->offload_param_nvme_path, sizeof cfg->offload_param_nvme_path, "%s", s);
        return ZS_OK;
    }
    int64_t *dst = kind == 1   ? &cfg->offload_param_buffer_count
                   : kind == 2 ? &cfg->offload_param_buffer_size
                               : &cfg->offload_param_max_in_cpu;
    /* buffers: at least one of at least one element; max_in_cpu may be 0 */
    int64_t lo = kind == 3 ? 0 : 1, hi = kind == 1 ? 1024 : INT64_MAX / 4;
    return zs__cfg_get_int(c, it, p, lo, hi, dst);
}

/* offload_optimizer / offload_param: device none|cpu|nvme. offload_optimizer
 * nvme is cpu plus the servers' NVMe tier (offload_nvme); offload_param nvme
 * keeps the stage-3 parameter partitions in files (offload_param_nvme, with
 * nvme_path required and buffer_count, buffer_size, max_in_cpu; with another
 * device those keys have no effect and say so). opt: the config whose
 * offload_optimizer keys go there, NULL for offload_param (where they are
 * unknown keys): super_offload (DeepSpeed's SuperOffload switch: the CPU
 * optimizer speculates before the gradient norm and overflow are known),
 * and zeroshard's speculate_every_step (also right after a step whose
 * scalars differed), stream_pulls (the next step's forward starts while
 * updated parameters arrive) and delayed_update_after (ZeRO-Offload's
 * one-step delayed parameter update after N steps; -1: off). */
static int parse_offload(pctx_t *c, const cJSON *o, const char *path, const char *const *not_impl,
                         int *out, zs_config_t *opt, zs_config_t *pcfg)
{
    *out = 0;
    if (pcfg)
        pcfg->offload_param_nvme = 0;
    if (cJSON_IsNull(o)) /* DeepSpeed: Optional[...] = None */
        return ZS_OK;
    int rc = zs__cfg_expect_object(c, o, path);
    if (rc != ZS_OK)
        return rc;
    for (const cJSON *it = o->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        zs__cfg_path_join(p, path, it->string);
        if (strcmp(it->string, "device") == 0) {
            const char *d = "";
            if ((rc = zs__cfg_get_string(c, it, p, &d)) != ZS_OK)
                return rc;
            if (strcmp(d, "cpu") == 0)
                *out = 1;
            else if (strcmp(d, "none") == 0)
                *out = 0;
            else if (strcmp(d, "nvme") == 0 && opt) /* the servers' NVMe tier */
                *out = opt->offload_nvme = 1;
            else if (strcmp(d, "nvme") == 0 && pcfg) /* parameter partitions in files */
                *out = pcfg->offload_param_nvme = 1;
            else
                return zs_err_set(c->err, ZS_ERR_INVALID,
                                  "%s: \"%.40s\" is not a device (DeepSpeed: \"none\", \"cpu\", "
                                  "\"nvme\")",
                                  p, d);
        } else if (opt && strcmp(it->string, "super_offload") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &opt->offload_speculate)) != ZS_OK)
                return rc;
        } else if (opt && strcmp(it->string, "speculate_every_step") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &opt->offload_speculate_every)) != ZS_OK)
                return rc;
        } else if (opt && strcmp(it->string, "stream_pulls") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &opt->offload_stream)) != ZS_OK)
                return rc;
        } else if (opt && strcmp(it->string, "delayed_update_after") == 0) {
            if ((rc = zs__cfg_get_int(c, it, p, -1, INT64_MAX, &opt->offload_delay_after)) != ZS_OK)
                return rc;
        } else if (pcfg && zs__cfg_in_list(it->string, OFFLOAD_PARAM_NVME_KEYS)) {
            int kind = 0;
            while (strcmp(OFFLOAD_PARAM_NVME_KEYS[kind], it->string) != 0)
                kind++;
            if ((rc = parse_param_nvme_key(c, it, p, kind, pcfg)) != ZS_OK)
                return rc;
        } else if (opt && nvme_no_effect(it->string)) {
            zs__cfg_warn_once(c, p, nvme_no_effect(it->string));
        } else if (zs__cfg_in_list(it->string, not_impl)) {
            zs__cfg_warn_once(c, p, "not implemented");
        } else {
            zs__cfg_unknown_in(c, path, it->string, opt ? OFFLOAD_OPT_KEYS : OFFLOAD_KEYS,
                               not_impl);
        }
    }
    if (pcfg && pcfg->offload_param_nvme && !pcfg->offload_param_nvme_path[0])
        return zs_err_set(c->err, ZS_ERR_INVALID,
                          "%s.device: \"nvme\" needs %s.nvme_path (the directory of the "
                          "parameter files, one per worker rank)",
                          path, path);
    /* the NVMe keys with another device: read, no effect */
    for (const cJSON *it = o->child; pcfg && !pcfg->offload_param_nvme && it; it = it->next)
        if (zs__cfg_in_list(it->string, OFFLOAD_PARAM_NVME_KEYS)) {
            char p[PATH_MAX_LEN];
            zs__cfg_path_join(p, path, it->string);
            zs__cfg_warn_once(c, p, "no effect: used with device \"nvme\" only");
        }
    return ZS_OK;
}

/* See zs_config_internal.h. */
int zs__cfg_parse_offload(pctx_t *c, const cJSON *o, const char *path, int param, zs_config_t *cfg)
{
    return param ? parse_offload(c, o, path, OFFLOAD_PARAM_NOT_IMPLEMENTED, &cfg->offload_param,
                                 NULL, cfg)
                 : parse_offload(c, o, path, OFFLOAD_OPT_NOT_IMPLEMENTED, &cfg->offload_optimizer,
                                 cfg, NULL);
}
