/*
 * zs_config_actckpt.c - DeepSpeed's "activation_checkpointing" section
 * (deepspeed.checkpointing's configuration), read into zs_config_t.
 *
 * In DeepSpeed the section configures deepspeed.checkpointing and the model
 * itself calls checkpoint() on the blocks it chooses. zeroshard's model is
 * its GPT, so the section being present (an object, even empty) means: the
 * GPT checkpoints every transformer block (act_ckpt = 1; zs_gpt.h,
 * zs_gpt_set_checkpointing). Its keys:
 *   cpu_checkpointing               implemented: checkpoints in pinned host
 *                                   memory (act_ckpt_cpu); DeepSpeed moves only
 *                                   partitioned activations, here it needs no
 *                                   partition_activations
 *   partition_activations           no effect: data parallelism has no
 *                                   model-parallel activations to partition
 *   contiguous_memory_optimization  no effect: the checkpoints are one
 *                                   contiguous allocation already
 *   number_checkpoints              no effect: one checkpoint per block
 *                                   (DeepSpeed sizes its contiguous buffer with it)
 *   synchronize_checkpoint_boundary no effect: the recompute is ordered on the
 *                                   compute stream, no device synchronisation
 *   profile                         no effect: no per-checkpoint timing
 * Each no-effect key is warned about once when the file gives it, whatever
 * its value (its value is still type-checked); unknown keys are refused with
 * the closest key, like every section zeroshard reads. null for the whole
 * section means not given.
 */
#include <string.h>

#include "zs_config.h"
#include "zs_config_internal.h"

static const char *const AC_KEYS[] = {"partition_activations",
                                      "cpu_checkpointing",
                                      "contiguous_memory_optimization",
                                      "number_checkpoints",
                                      "synchronize_checkpoint_boundary",
                                      "profile",
                                      NULL};

#define NE_PARTITION                                                                               \
    "no effect: data-parallel workers hold no model-parallel activations to partition; each "      \
    "worker keeps its own checkpoints"
#define NE_CONTIGUOUS "no effect: the checkpoints are one contiguous allocation already"
#define NE_NUMBER                                                                                  \
    "no effect: the GPT checkpoints every transformer block (DeepSpeed sizes its contiguous "      \
    "buffer with it)"
#define NE_SYNC                                                                                    \
    "no effect: the recompute is ordered on the compute stream; no device synchronisation at "     \
    "checkpoint boundaries"
#define NE_PROFILE "no effect: checkpoints are not timed (the step split times forward/backward)"

/* Parse the section; see zs_config_internal.h. */
int zs__cfg_parse_actckpt(pctx_t *c, const cJSON *o, zs_config_t *cfg)
{
    const char *sec = "activation_checkpointing";
    if (cJSON_IsNull(o))
        return ZS_OK;
    int rc = zs__cfg_expect_object(c, o, sec);
    if (rc != ZS_OK)
        return rc;
    cfg->act_ckpt = 1;
    for (const cJSON *it = o->child; it; it = it->next) {
        char p[PATH_MAX_LEN];
        const char *k = it->string;
        int b = 0;
        int64_t n = 0;
        zs__cfg_path_join(p, sec, k);
        if (strcmp(k, "cpu_checkpointing") == 0) {
            rc = zs__cfg_get_bool(c, it, p, &cfg->act_ckpt_cpu);
        } else if (strcmp(k, "partition_activations") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &b)) == ZS_OK)
                zs__cfg_warn_once(c, p, NE_PARTITION);
        } else if (strcmp(k, "contiguous_memory_optimization") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &b)) == ZS_OK)
                zs__cfg_warn_once(c, p, NE_CONTIGUOUS);
        } else if (strcmp(k, "number_checkpoints") == 0) {
            /* DeepSpeed: Optional[int], None by default */
            if (!cJSON_IsNull(it))
                rc = zs__cfg_get_int(c, it, p, 1, INT32_MAX, &n);
            if (rc == ZS_OK)
                zs__cfg_warn_once(c, p, NE_NUMBER);
        } else if (strcmp(k, "synchronize_checkpoint_boundary") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &b)) == ZS_OK)
                zs__cfg_warn_once(c, p, NE_SYNC);
        } else if (strcmp(k, "profile") == 0) {
            if ((rc = zs__cfg_get_bool(c, it, p, &b)) == ZS_OK)
                zs__cfg_warn_once(c, p, NE_PROFILE);
        } else {
            rc = zs__cfg_unknown_in(c, sec, k, AC_KEYS, NULL);
        }
        if (rc != ZS_OK)
            return rc;
    }
    return ZS_OK;
}
