/*
 * zs_ctl_reshard.c - zs-ctl reshard: move a complete checkpoint from S
 * servers to S' other servers, so training resumes on S' servers.
 *
 *   zs-ctl reshard --from a:p,b:p --to c:p,d:p,e:p [--step S] [--restore]
 *                  [--overwrite] [--token-file F] [--tls-ca F]
 *
 * The target ranges are zs_layout's for (P, S'), the same function every
 * server and client uses. For each target server j, streamed with one chunk
 * (ZS_CTL_CHUNK) in memory: Initialize j with the source's master weights
 * of its range (model name, P, hyperparameters and step as the source's),
 * then SetState exp_avg and exp_avg_sq of the range. Then every target gets
 * the checkpoint's step and Adam t (SetStep) and writes checkpoint S with
 * the source's user_meta (the engine's state and the model manifest, byte
 * for byte). Checked end to end: an XXH3-64 of each (target range, tensor)
 * is taken over the bytes read from the source as they are sent; after the
 * target checkpoint is durable the targets Restore it (their store verifies
 * its own chunk checksums while loading), the ranges are read back and
 * hashed again, and the target's stored metadata must equal the source's.
 * On any mismatch the target checkpoint is deleted and the command fails.
 * The source is only read (see zs_ctl.h: the servers must hold checkpoint
 * S live, or --restore), never changed, and nothing is deleted from it.
 *
 * Targets must be other servers than the sources (compared by address: do
 * not name one server twice under two addresses) and hold no model, or
 * --overwrite. Test-only fault: ZS_CTL_DEBUG_CORRUPT=1 in the environment
 * flips one bit of one chunk after it was hashed, so the end-to-end check
 * must fail.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "zs_ctl.h"
#include "zs_layout.h"
#include "zs_log.h"

static const char *const k_tensor[3] = {"master", "exp_avg", "exp_avg_sq"};

typedef struct {
    const char *from, *to, *token_file, *ca_file;
    uint64_t step;
    int restore, overwrite;
} reshard_opts_t;

/* The fill of one (target range, tensor) stream: read from the source,
 * hash what is sent. */
typedef struct {
    zs_ctl_src_t *src;
    int tensor;
    uint64_t begin; /* the range's first element: a (re)started stream resets the hash */
    XXH3_state_t *h;
    int corrupt; /* ZS_CTL_DEBUG_CORRUPT: flip a bit after hashing (once) */
} fill_t;

static int fill(void *ud, uint64_t offset, uint64_t count, float *dst, zs_err_t *err)
{
    fill_t *f = ud;
    if (offset == f->begin)
        XXH3_64bits_reset(f->h);
    int rc = zs_ctl_src_read(f->src, f->tensor, offset, offset + count, dst, err);
    if (rc)
        return rc;
    XXH3_64bits_update(f->h, dst, (size_t)count * sizeof(float));
    if (f->corrupt) {
        uint32_t u;
        memcpy(&u, dst, 4);
        u ^= 1u << 3;
        memcpy(dst, &u, 4);
        f->corrupt = 0;
    }
    return ZS_OK;
}

/* XXH3-64 of the target's `tensor` over [b, e), read back in chunks. */
static int hash_back(zs_client_t *dst, uint64_t step, int tensor, uint64_t b, uint64_t e,
                     float *buf, XXH3_state_t *h, uint64_t *out, zs_err_t *err)
{
    XXH3_64bits_reset(h);
    for (uint64_t at = b; at < e;) {
        uint64_t k = e - at < ZS_CTL_CHUNK ? e - at : ZS_CTL_CHUNK, lo, hi;
        int rc = zs_client_get_state_step(dst, tensor, at, at + k, buf, &lo, &hi, err);
        if (!rc && (lo != step || hi != step))
            rc = zs_err_set(err, ZS_ERR_STATE, "target moved to step %llu while being verified",
                            (unsigned long long)(lo != step ? lo : hi));
        if (rc)
            return rc;
        XXH3_64bits_update(h, buf, (size_t)k * sizeof(float));
        at += k;
    }
    *out = XXH3_64bits_digest(h);
    return ZS_OK;
}

/* Targets: none is a source, none holds a model unless --overwrite. */
static int check_targets(zs_client_t *src, zs_client_t *dst, int overwrite, zs_err_t *err)
{
    int n = zs_client_nservers(dst);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < zs_client_nservers(src); i++)
            if (!strcmp(zs_client_server(dst, j), zs_client_server(src, i)))
                return zs_err_set(err, ZS_ERR_INVALID,
                                  "%s is a source and a target: the source must stay untouched "
                                  "until the target is complete (use other servers)",
                                  zs_client_server(dst, j));
    zs_server_info_t *in = calloc((size_t)n, sizeof *in);
    if (!in)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    /* Hello without an identity: a target initialised with another layout
     * is a layout mismatch (ZS_ERR_STATE), itself a reason to refuse
     * without --overwrite; Initialize with overwrite replaces it. */
    int rc = zs_client_hello(dst, "", 0, in, err);
    if (rc == ZS_ERR_STATE && overwrite)
        rc = ZS_OK;
    else if (rc)
        zs_err_prefix(err, "targets: ");
    for (int j = 0; j < n && !rc && !overwrite; j++)
        if (in[j].initialized)
            rc = zs_err_set(err, ZS_ERR_EXISTS,
                            "target %s holds model '%s' (step %llu): pass --overwrite to replace "
                            "it",
                            zs_client_server(dst, j), in[j].model_name,
                            (unsigned long long)in[j].applied_step);
    free(in);
    return rc;
}

/* Copy every target range, checkpoint, verify. hashes[j][x] as sent. */
static int reshard(zs_ctl_src_t *s, zs_client_t *dst, int overwrite, zs_err_t *err)
{
    int n = zs_client_nservers(dst);
    uint64_t(*sent)[3] = calloc((size_t)n, sizeof *sent);
    float *buf = malloc(ZS_CTL_CHUNK * sizeof(float));
    XXH3_state_t *h = XXH3_createState();
    int rc = sent && buf && h ? ZS_OK : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    const char *dbg = getenv("ZS_CTL_DEBUG_CORRUPT");
    int corrupt = dbg && !strcmp(dbg, "1");
    const zs_ckpt_info_t *ci = &s->info[0];
    if (!rc) /* the source's parameter groups go with its hyperparameters */
        rc = zs_client_set_groups(dst, ci->groups, ci->ngroups, err);
    for (int j = 0; j < n && !rc; j++) {
        uint64_t b = zs_layout_begin(s->P, (uint32_t)n, (uint32_t)j);
        uint64_t e = zs_layout_begin(s->P, (uint32_t)n, (uint32_t)j + 1);
        for (int x = 0; x < 3 && !rc; x++) {
            fill_t f = {s, x, b, h, corrupt && j == n - 1 && x == 2};
            XXH3_64bits_reset(h);
            if (x == 0)
                rc = zs_client_init_server(dst, j, ci->model_name, s->P, &ci->adam, s->step,
                                           overwrite, fill, &f, err);
            else
                rc = zs_client_set_state_server(dst, j, x, fill, &f, err);
            sent[j][x] = XXH3_64bits_digest(h);
        }
        if (!rc)
            printf("reshard: target %d %s [%llu, %llu): master %016llx exp_avg %016llx "
                   "exp_avg_sq %016llx\n",
                   j, zs_client_server(dst, j), (unsigned long long)b, (unsigned long long)e,
                   (unsigned long long)sent[j][0], (unsigned long long)sent[j][1],
                   (unsigned long long)sent[j][2]);
    }
    if (!rc)
        rc = zs_client_set_step(dst, s->step, s->adam_t, err);
    if (!rc)
        rc = zs_client_checkpoint_meta(dst, s->step, 0, s->meta, s->meta_len, err);
    int written = !rc;
    /* Verify what is durable: Restore (the target's store checks its chunk
     * checksums), read back, compare. */
    if (!rc)
        rc = zs_client_restore(dst, s->step, err);
    zs_ckpt_info_t *ti = rc ? NULL : calloc((size_t)n, sizeof *ti);
    uint8_t *tmeta = rc ? NULL : malloc(ZS_CLIENT_USER_META_MAX);
    size_t tlen = 0;
    if (!rc && (!ti || !tmeta))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (!rc)
        rc =
            zs_client_checkpoint_info(dst, s->step, ti, tmeta, ZS_CLIENT_USER_META_MAX, &tlen, err);
    if (!rc &&
        (tlen != s->meta_len || memcmp(tmeta, s->meta, tlen) || ti[0].optimizer_step != s->adam_t ||
         ti[0].num_params != s->P || strcmp(ti[0].model_name, ci->model_name) ||
         memcmp(&ti[0].adam, &ci->adam, sizeof ci->adam) ||
         !zs_groups_equal(ti[0].groups, ti[0].ngroups, ci->groups, ci->ngroups)))
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "target checkpoint %llu: stored metadata differs from the source's",
                        (unsigned long long)s->step);
    for (int j = 0; j < n && !rc; j++) {
        uint64_t b = zs_layout_begin(s->P, (uint32_t)n, (uint32_t)j);
        uint64_t e = zs_layout_begin(s->P, (uint32_t)n, (uint32_t)j + 1);
        for (int x = 0; x < 3 && !rc && e > b; x++) {
            uint64_t got;
            rc = hash_back(dst, s->step, x, b, e, buf, h, &got, err);
            if (!rc && got != sent[j][x])
                rc = zs_err_set(err, ZS_ERR_CORRUPT,
                                "checksum mismatch: target %s %s [%llu, %llu) holds %016llx, the "
                                "source sent %016llx",
                                zs_client_server(dst, j), k_tensor[x], (unsigned long long)b,
                                (unsigned long long)e, (unsigned long long)got,
                                (unsigned long long)sent[j][x]);
        }
    }
    if (!rc)
        rc = zs_ctl_src_verify(s, err);
    if (rc && written) { /* nobody may resume from a target that does not verify */
        zs_err_t derr;
        if (zs_client_delete(dst, s->step, 0, &derr))
            ZS_ERROR("could not delete the unverified target checkpoint %llu: %s",
                     (unsigned long long)s->step, derr.msg);
        else
            ZS_WARN("deleted the unverified target checkpoint %llu", (unsigned long long)s->step);
    }
    free(ti);
    free(tmeta);
    XXH3_freeState(h);
    free(buf);
    free(sent);
    return rc;
}

typedef struct {
    zs_client_t *src, *dst;
    int overwrite;
} reshard_run_t;

/* zs_ctl_before_fn of reshard: check_targets, before the sources are touched. */
static int reshard_before(void *ud, zs_err_t *err)
{
    reshard_run_t *r = ud;
    return check_targets(r->src, r->dst, r->overwrite, err);
}

/* zs_ctl_run_fn of reshard: move and verify, then say what was moved. */
static int reshard_run(zs_ctl_src_t *s, void *ud, zs_err_t *err)
{
    reshard_run_t *r = ud;
    int rc = reshard(s, r->dst, r->overwrite, err);
    if (!rc)
        printf("reshard: checkpoint %llu (Adam t %llu, %llu parameters) moved from %d to %d "
               "servers and verified (restored from the targets' stores, every range's "
               "hash matches)\n",
               (unsigned long long)s->step, (unsigned long long)s->adam_t, (unsigned long long)s->P,
               s->S, zs_client_nservers(r->dst));
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-ctl reshard --from HOST:PORT[,...] --to HOST:PORT[,...] [--step S]\n"
               "              [--restore] [--overwrite] [--token-file F] [--tls-ca F]\n"
               "  --from LIST   the servers holding the checkpoint, in index order\n"
               "  --to LIST     the new servers (any number, none of the sources)\n"
               "  --step S      checkpoint to move (default: the newest complete one)\n"
               "  --restore     if the sources hold another step: Restore S first and restore\n"
               "                what they held after (only while no trainer runs)\n"
               "  --overwrite   replace a model the targets hold\n");
}

int zs_ctl_reshard_main(int argc, char **argv)
{
    reshard_opts_t o = {0};
    static const struct option lo[] = {{"from", 1, 0, 'f'},    {"to", 1, 0, 't'},
                                       {"servers", 1, 0, 's'}, {"token-file", 1, 0, 'k'},
                                       {"tls-ca", 1, 0, 'c'},  {"step", 1, 0, 'S'},
                                       {"restore", 0, 0, 'R'}, {"overwrite", 0, 0, 'O'},
                                       {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'f':
        case 's': /* --servers before the command word means the sources */
            o.from = optarg;
            break;
        case 't':
            o.to = optarg;
            break;
        case 'k':
            o.token_file = optarg;
            break;
        case 'c':
            o.ca_file = optarg;
            break;
        case 'S':
            if (zs_ctl_parse_step("reshard", optarg, &o.step))
                return 2;
            break;
        case 'R':
            o.restore = 1;
            break;
        case 'O':
            o.overwrite = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!o.from || !o.to || optind < argc) {
        usage(stderr);
        return 2;
    }
    zs_client_t *src, *dst = NULL;
    if (zs_ctl_connect(o.from, o.token_file, o.ca_file, &src))
        return 1;
    if (zs_ctl_connect(o.to, o.token_file, o.ca_file, &dst)) {
        zs_client_destroy(src);
        return 1;
    }
    reshard_run_t r = {src, dst, o.overwrite};
    int st = zs_ctl_src_run("reshard", src, o.step, o.restore, reshard_before, reshard_run, &r);
    zs_client_destroy(dst);
    zs_client_destroy(src);
    return st;
}
