/*
 * test_adam_groups.c - parameter groups (kernels/zs_adam_groups.h;
 * protocol version 3, docs/protocol.md "Parameter groups"), one behaviour
 * per check:
 *   1. zs_groups_check refuses what is not a model's consecutive ranges
 *      (empty or descending range, short of P, NaN or negative decay, an lr
 *      index past the limit, too many ranges) and takes none;
 *   2. zs_groups_piece cuts [off, off + len) at range ends with each
 *      range's weight decay and lr, and passes the base scalars without
 *      groups;
 *   3. two real zs-servers initialized with 4 ranges (2 learning rates,
 *      decays 0 / 0.1 / 0 / 0.3; the ranges straddle the servers' boundary
 *      and the optimizer's 64 Ki-element chunks) train 4 steps, one
 *      speculated (push_expect stating the group lrs): every step is
 *      bitwise the reference (zs_adam_update_ref per range with its
 *      scalars), and at step 4 not what one weight decay for all gives;
 *   4. Hello and GetCheckpointMeta report the groups; a server killed and
 *      restarted restores them with its checkpoint: the repeated Commit of
 *      step 4 is recognised (same group lrs; others refused) and step 5 is
 *      the reference's;
 *   5. zs-ctl reshard of checkpoint 5 from the 2 servers to a third one
 *      carries the groups: it reports them, and step 6 on it alone is the
 *      reference's, bitwise;
 *   6. refusals: a Commit with fewer group lrs than the groups need, group
 *      lrs for a model without groups, groups not ending at P.
 * Does not: the torch side (test_python), zs-train --decay (test_train 6),
 * old servers (test_protocol 9).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_adam_groups.h"
#include "zs_client.h"
#include "zs_proc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define P      (5ull * 65536 + 777) /* two servers, several optimizer chunks each */
#define TMO_MS 20000

static const zs_group_range_t k_groups[4] = {
    {70000, 0.0f, 0}, {165000, 0.1f, 1}, {200000, 0.0f, 1}, {P, 0.3f, 0}};
/* the group lrs of steps 1..5 (row 0 unused) */
static const float k_lrs[7][2] = {{0},           {1e-3f, 3e-3f}, {2e-3f, 1e-3f},
                                  {1e-3f, 5e-4f},  {4e-4f, 2e-3f}, {3e-4f, 1e-3f},
                                  {2e-4f, 6e-4f}};

static void unit_check(void)
{
    zs_err_t err;
    TEST_OK(zs_groups_check(k_groups, 4, P, &err), err);
    TEST_OK(zs_groups_check(NULL, 0, P, &err), err);
    zs_group_range_t r[4];
    memcpy(r, k_groups, sizeof r);
    r[1].end = r[0].end; /* empty */
    TEST_CHECK(zs_groups_check(r, 4, P, &err) == ZS_ERR_INVALID && strstr(err.msg, "range 1"));
    memcpy(r, k_groups, sizeof r);
    TEST_CHECK(zs_groups_check(r, 3, P, &err) == ZS_ERR_INVALID && strstr(err.msg, "end at"));
    r[2].weight_decay = NAN;
    TEST_CHECK(zs_groups_check(r, 4, P, &err) == ZS_ERR_INVALID && strstr(err.msg, "finite"));
    r[2].weight_decay = -1.0f;
    TEST_CHECK(zs_groups_check(r, 4, P, &err) == ZS_ERR_INVALID);
    memcpy(r, k_groups, sizeof r);
    r[3].lr_index = ZS_GROUPS_MAX_LRS;
    TEST_CHECK(zs_groups_check(r, 4, P, &err) == ZS_ERR_INVALID && strstr(err.msg, "lr_index"));
    TEST_CHECK(zs_groups_check(r, ZS_GROUPS_MAX_RANGES + 1, P, &err) == ZS_ERR_INVALID);
    TEST_CHECK(zs_groups_nlrs(k_groups, 4) == 2 && zs_groups_nlrs(NULL, 0) == 0);
    printf("ok  1. zs_groups_check refuses bad ranges, takes none\n");

    zs_adam_hparams_t base = zs_synth_hparams(), hp;
    zs_adam_step_t bst = {7e-4f, 3, 1.0f, 1.0f}, st;
    const float lrs[2] = {1e-3f, 3e-3f};
    /* from 69990: 10 elements of range 0, then range 1 up to 165000 */
    uint64_t k = zs_groups_piece(k_groups, 4, lrs, 2, &base, &bst, 69990, 100000, &hp, &st);
    TEST_CHECK(k == 10 && hp.weight_decay == 0.0f && st.lr == 1e-3f && st.t == 3);
    k = zs_groups_piece(k_groups, 4, lrs, 2, &base, &bst, 70000, 100000, &hp, &st);
    TEST_CHECK(k == 95000 && hp.weight_decay == 0.1f && st.lr == 3e-3f);
    k = zs_groups_piece(k_groups, 4, NULL, 0, &base, &bst, 250000, 5, &hp, &st);
    TEST_CHECK(k == 5 && hp.weight_decay == 0.3f && st.lr == 7e-4f); /* no lrs: the step's */
    k = zs_groups_piece(NULL, 0, lrs, 2, &base, &bst, 5, 1000, &hp, &st);
    TEST_CHECK(k == 1000 && hp.weight_decay == base.weight_decay && st.lr == 7e-4f);
    printf("ok  2. zs_groups_piece cuts at range ends with each range's scalars\n");
}

/* The reference: step s on p, m, v (P each) with the synthetic gradient,
 * per range with its decay and lr (one_decay: every range with the base
 * decay instead, to show the groups matter). */
static void ref_step(uint64_t s, int64_t t, float *p, float *m, float *v, int one_decay)
{
    zs_adam_hparams_t hp = zs_synth_hparams();
    float *g = malloc(P * 4), *tmp = malloc(P * 4);
    TEST_CHECK(g && tmp);
    zs_synth_grad(s, 0, P, g, tmp);
    uint64_t b = 0;
    for (int r = 0; r < 4; r++) {
        zs_adam_hparams_t h = hp;
        if (!one_decay)
            h.weight_decay = k_groups[r].weight_decay;
        zs_adam_step_t st = {k_lrs[s][k_groups[r].lr_index], t, 1.0f, 1.0f};
        size_t esz = zs_dtype_size(zs_synth_dtype(s));
        zs_adam_update_ref(&h, &st, p + b, m + b, v + b, (const char *)g + b * esz,
                           zs_synth_dtype(s), NULL, ZS_DTYPE_NONE, k_groups[r].end - b);
        b = k_groups[r].end;
    }
    free(g);
    free(tmp);
}

static void push_commit(zs_client_t *c, uint64_t s, int speculate)
{
    zs_err_t err;
    float *g = malloc(P * 4), *tmp = malloc(P * 4);
    TEST_CHECK(g && tmp);
    zs_synth_grad(s, 0, P, g, tmp);
    zs_step_scalars_t sc = {s, 1.0f, 1.0f, k_lrs[s][0], 0, ZS_DTYPE_NONE, 2, k_lrs[s]};
    TEST_OK(zs_client_push_expect(c, s, 0, P, g, zs_synth_dtype(s), speculate ? &sc : NULL, &err),
            err);
    TEST_OK(zs_client_commit(c, &sc, &err), err);
    free(g);
    free(tmp);
}

static double max_diff(zs_client_t *c, uint64_t s, const float *want)
{
    float *got = malloc(P * 4);
    TEST_CHECK(got);
    zs_err_t err;
    TEST_OK(zs_client_pull(c, s, 0, P, got, ZS_DTYPE_F32, NULL, &err), err);
    double d = 0;
    for (uint64_t i = 0; i < P; i++)
        if (fabs((double)got[i] - want[i]) > d)
            d = fabs((double)got[i] - want[i]);
    free(got);
    return d;
}

static zs_client_t *client(const char *list)
{
    zs_client_opts_t o = {list, NULL, NULL, TMO_MS, 0};
    zs_client_t *c;
    zs_err_t err;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    return c;
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    unit_check();
    char tmp[200], list[256];
    snprintf(tmp, sizeof tmp, "%s", zs_test_tmpdir("groups"));
    zs_test_server_t srv[2];
    zs_test_servers_up(srv, 2, tmp, "s", "--keep 2", list, sizeof list);
    zs_client_t *c = client(list);
    zs_err_t err;
    zs_adam_hparams_t hp = zs_synth_hparams();
    float *p = malloc(P * 4), *m = calloc(P, 4), *v = calloc(P, 4), *one = malloc(P * 4),
          *m1 = calloc(P, 4), *v1 = calloc(P, 4);
    TEST_CHECK(p && m && v && one && m1 && v1);
    for (uint64_t i = 0; i < P; i++)
        p[i] = zs_synth_weight(i);
    memcpy(one, p, P * 4);
    TEST_OK(zs_client_set_groups(c, k_groups, 4, &err), err);
    TEST_OK(zs_client_init(c, "groups", P, &hp, p, 0, 1, &err), err);

    /* 3. four steps, the third speculated */
    for (uint64_t s = 1; s <= 4; s++) {
        push_commit(c, s, s == 3);
        ref_step(s, (int64_t)s, p, m, v, 0);
        ref_step(s, (int64_t)s, one, m1, v1, 1);
        double d = max_diff(c, s, p);
        TEST_CHECKF(d == 0, "step %llu differs from the per-range reference by %g",
                    (unsigned long long)s, d);
    }
    double d1 = max_diff(c, 4, one);
    TEST_CHECKF(d1 > 0, "the groups made no difference to one weight decay for all");
    printf("ok  3. 4 steps (one speculated) bitwise the per-range reference; one decay for all "
           "differs by %.3g\n",
           d1);

    /* 4. reported, checkpointed, restored */
    TEST_OK(zs_client_checkpoint(c, 4, 0, &err), err);
    zs_server_info_t *in = calloc(2, sizeof *in);
    zs_ckpt_info_t *ci = calloc(2, sizeof *ci);
    TEST_CHECK(in && ci);
    TEST_OK(zs_client_hello(c, "groups", P, in, &err), err);
    TEST_OK(zs_client_checkpoint_info(c, 4, ci, NULL, 0, NULL, &err), err);
    for (int i = 0; i < 2; i++)
        TEST_CHECKF(zs_groups_equal(in[i].groups, in[i].ngroups, k_groups, 4) &&
                        zs_groups_equal(ci[i].groups, ci[i].ngroups, k_groups, 4),
                    "server %d reports %zu / %zu ranges", i, in[i].ngroups, ci[i].ngroups);
    zs_test_server_stop(&srv[1], SIGKILL);
    zs_test_server_start(&srv[1]); /* same port and data dir: loads checkpoint 4 */
    TEST_OK(zs_client_hello(c, "groups", P, in, &err), err);
    TEST_CHECKF(zs_groups_equal(in[1].groups, in[1].ngroups, k_groups, 4),
                "the restarted server reports %zu ranges", in[1].ngroups);
    zs_step_scalars_t again = {4, 1.0f, 1.0f, k_lrs[4][0], 0, ZS_DTYPE_NONE, 2, k_lrs[4]};
    TEST_OK(zs_client_commit(c, &again, &err), err);
    const float other[2] = {k_lrs[4][0], k_lrs[4][1] * 2};
    again.lrs = other;
    TEST_CHECKF(zs_client_commit(c, &again, &err) == ZS_ERR_STATE,
                "a repeat of step 4 with other group lrs must be refused");
    push_commit(c, 5, 0);
    ref_step(5, 5, p, m, v, 0);
    double d5 = max_diff(c, 5, p);
    TEST_CHECKF(d5 == 0, "step 5 after the restart differs from the reference by %g", d5);
    printf("ok  4. Hello and GetCheckpointMeta report the groups; a restarted server restores "
           "them: the repeat of step 4 is recognised, step 5 bitwise\n");

    /* 5. reshard to a third server: the groups go with the state */
    TEST_OK(zs_client_checkpoint(c, 5, 0, &err), err);
    zs_test_server_t tgt;
    char tlist[256];
    zs_test_servers_up(&tgt, 1, tmp, "t", "", tlist, sizeof tlist);
    char log[300];
    snprintf(log, sizeof log, "%s/reshard.log", tmp);
    zs_test_run_ok(log, "%s reshard --from %s --to %s --step 5", ZS_CTL, list, tlist);
    zs_client_t *ct = client(tlist);
    TEST_OK(zs_client_hello(ct, "groups", P, in, &err), err);
    TEST_CHECKF(zs_groups_equal(in[0].groups, in[0].ngroups, k_groups, 4),
                "the reshard target reports %zu ranges", in[0].ngroups);
    push_commit(ct, 6, 0);
    ref_step(6, 6, p, m, v, 0);
    double d6 = max_diff(ct, 6, p);
    TEST_CHECKF(d6 == 0, "step 6 on the reshard target differs from the reference by %g", d6);
    zs_client_destroy(ct);
    zs_test_servers_down(&tgt, 1);
    printf("ok  5. zs-ctl reshard 2 -> 1 servers carries the groups: step 6 there bitwise\n");

    /* 6. refusals */
    zs_step_scalars_t few = {6, 1.0f, 1.0f, 1e-3f, 0, ZS_DTYPE_NONE, 1, k_lrs[1]};
    int rc = zs_client_commit(c, &few, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "need 2"),
                "a commit with 1 group lr for 2 was not refused: %s (%s)", zs_status_name(rc),
                err.msg);
    printf("ok  6. a commit with too few group lrs: %s\n", err.msg);
    zs_client_t *c2 = client(list);
    rc = zs_client_set_groups(c2, k_groups, 4, &err);
    if (!rc)
        rc = zs_client_init(c2, "groups", P - 1, &hp, p, 0, 1, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "end at"),
                "groups not ending at P were taken: %s (%s)", zs_status_name(rc), err.msg);
    printf("ok  6. groups not ending at P: %s\n", err.msg);
    TEST_OK(zs_client_set_groups(c2, NULL, 0, &err), err);
    TEST_OK(zs_client_init(c2, "plain", P, &hp, p, 0, 1, &err), err);
    few.step = 1;
    rc = zs_client_commit(c2, &few, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID && strstr(err.msg, "no parameter groups"),
                "group lrs for a model without groups: %s (%s)", zs_status_name(rc), err.msg);
    printf("ok  6. group lrs for a model without groups: %s\n", err.msg);
    zs_client_destroy(c2);
    free(in);
    free(ci);
    free(p);
    free(m);
    free(v);
    free(one);
    free(m1);
    free(v1);
    zs_client_destroy(c);
    zs_test_servers_down(srv, 2);
    printf("PASS test_adam_groups\n");
    return 0;
}
