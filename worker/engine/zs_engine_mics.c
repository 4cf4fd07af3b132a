/*
 * zs_engine_mics.c - MiCS (zero_optimization.mics_shard_size G,
 * mics_hierarchical_params_gather): the engine partitions within shard
 * groups of G consecutive ranks and replicates across the W / G groups.
 *
 * What changes elsewhere (the engine reads e->pc, e->rep, e->Wd, e->wrank):
 *   layout     W = G, rank = the place in the shard group, so parameters,
 *              gradients, optimizer state and every partitioned buffer are
 *              1/G of the model (zs_engine.c's layout, unchanged)
 *   gradients  each segment is reduce-scattered within the shard group,
 *              then this worker's block is all-reduced (sum) across its
 *              replica group (zs_engine_step.c): every rank ends with the
 *              global sum of its 1/G partition
 *   gathers    within the shard group; two hops (across nodes, then within
 *              the node: zs_coll_all_gather_hier) with the hierarchical key
 *              when a shard group spans nodes (zs_engine_gather.c)
 *   the norm   all-reduced over the shard group (the replica groups hold
 *              the same partitions after the all-reduce)
 *   batches    the world's rank and size (e->wrank, e->Wd); the loss and
 *              the gradient scale 1 / (loss scale * Wd * gas) too
 *   servers    only shard group 0 pushes gradients (its ranks cover the
 *              flat space once, as at W = G) and uploads optimizer state;
 *              every rank pulls its own partition (reads; the servers'
 *              pull traffic is W / G times a group's); world rank 0
 *              commits, checkpoints and restores as before. The servers'
 *              ranges do not depend on W or G, so a resume with another W
 *              or G maps the new partitions onto them.
 *
 * What it does not do: stages 0-2 (DeepSpeed's MiCS is stage 3), hpZ, qgZ
 * or qwZ together with it (refused at start, naming the keys).
 */
#include "zs_engine_internal.h"
#include "zs_log.h"

int zs__eng_mics_setup(zs_engine_t *e, zs_err_t *err)
{
    int64_t g = e->cfg.mics_shard_size;
    e->pc = e->coll;
    if (g <= 0)
        return ZS_OK;
    if (e->stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %lld: MiCS partitions stage 3's parameters within "
                          "shard groups, but stage is %d (hint: stage 3, or -1)",
                          (long long)g, e->stage);
    if (g > e->Wd || e->Wd % g != 0)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %lld must divide the %d workers (shard groups of "
                          "equal size; %d is plain ZeRO-3, -1 is off)",
                          (long long)g, e->Wd, e->Wd);
    /* one shard group is plain ZeRO-3: nothing to build, unless its
     * gathers are to go in two hops */
    if (g == e->Wd && !e->cfg.mics_hierarchical_params_gather)
        return ZS_OK;
    if (e->cfg.zero_hpz_partition_size > 1)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %lld with zero_hpz_partition_size %lld: hpZ's "
                          "secondary partition over the whole world is not combined with MiCS's "
                          "shard groups here (hint: one of them)",
                          (long long)g, (long long)e->cfg.zero_hpz_partition_size);
    if (e->cfg.zero_quantized_gradients)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %lld with zero_quantized_gradients: qgZ's two-hop "
                          "reduce-scatter runs over the whole world, not within MiCS's shard "
                          "groups (hint: one of them)",
                          (long long)g);
    if (e->cfg.zero_quantized_weights)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "mics_shard_size %lld with zero_quantized_weights: qwZ is not combined "
                          "with MiCS's shard groups here (hint: one of them)",
                          (long long)g);
    int two_hop = 0;
    ZS_ENG_TRY(
        zs_coll_mics(e->coll, (int)g, e->cfg.mics_hierarchical_params_gather, &two_hop, err));
    e->mics = (int)g;
    e->pc = zs_coll_shard(e->coll);
    e->rep = e->Wd > (int)g ? zs_coll_replica(e->coll) : NULL; /* no replicas at G = W */
    e->W = e->pc->size;
    e->rank = e->pc->rank;
    e->rgroup = e->wrank / (int)g;
    e->mics_hier = two_hop;
    if (e->wrank == 0)
        ZS_INFO("MiCS: %d shard groups of %d workers (parameters, gradients and optimizer state "
                "1/%d per worker), gradients all-reduced across %d replicas; parameter gathers "
                "%s",
                e->Wd / (int)g, (int)g, (int)g, e->Wd / (int)g,
                two_hop ? "in two hops (across nodes, then within the node)"
                : e->cfg.mics_hierarchical_params_gather
                    ? "in one hop (every shard group lies within a node)"
                    : "in one hop");
    return ZS_OK;
}
