/*
 * zs_ctl_src.c - a checkpoint to read from a set of shard servers (see
 * zs_ctl.h: which checkpoint, why the live state is what is read, when a
 * Restore is done), and what export and reshard share around it: the
 * connection, --step, and the run on a source with its timing and peak
 * memory line.
 *
 * Does not: interpret the checkpoint's user_meta (export and reshard do),
 * or change anything on the servers except the Restores of --restore.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "zs_ctl.h"
#include "zs_file.h"
#include "zs_log.h"

int zs_ctl_connect(const char *servers, const char *token_file, const char *ca_file,
                   zs_client_t **out)
{
    *out = NULL;
    char *token = token_file ? zs_file_read_text(token_file, 4096, 1) : NULL;
    char *ca = ca_file ? zs_file_read_text(ca_file, 1 << 20, 0) : NULL;
    if ((token_file && !token) || (ca_file && !ca)) {
        fprintf(stderr, "zs-ctl: cannot read %s\n", token_file && !token ? token_file : ca_file);
        free(token);
        free(ca);
        return 1;
    }
    zs_client_opts_t o = {servers, token, ca, 60000, 2};
    zs_err_t err;
    zs_err_clear(&err);
    int rc = zs_client_create(&o, out, &err);
    if (rc)
        fprintf(stderr, "zs-ctl: %s\n", err.msg);
    free(token); /* the client keeps its own copy; the CA is used at create */
    free(ca);
    return rc ? 1 : 0;
}

/* VmHWM of this program's own address space. getrusage's ru_maxrss would
 * also count the pages of the process that forked us, up to our exec. */
double zs_ctl_peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    if (kib >= 0)
        return kib / 1024.0;
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0.0;
}

/* Hello to every server: all hold a model (of one P). */
static int hello_all(zs_client_t *c, zs_server_info_t *in, zs_err_t *err)
{
    int rc = zs_client_hello(c, "", 0, in, err);
    for (int i = 0; !rc && i < zs_client_nservers(c); i++)
        if (!in[i].initialized)
            rc = zs_err_set(err, ZS_ERR_STATE, "%s holds no model", zs_client_server(c, i));
    return rc;
}

/* The newest complete checkpoint, or `want` if it is complete. */
static int pick_step(zs_client_t *c, uint64_t want, uint64_t *step, zs_err_t *err)
{
    uint64_t steps[ZS_CLIENT_MAX_CKPTS];
    size_t n = 0;
    int rc = zs_client_checkpoints(c, steps, ZS_CLIENT_MAX_CKPTS, &n, err);
    if (rc)
        return rc;
    if (n > ZS_CLIENT_MAX_CKPTS)
        n = ZS_CLIENT_MAX_CKPTS;
    if (n == 0)
        return zs_err_set(err, ZS_ERR_NOTFOUND, "no checkpoint is complete on every server");
    *step = steps[n - 1];
    if (!want)
        return ZS_OK;
    for (size_t i = 0; i < n; i++)
        if (steps[i] == want) {
            *step = want;
            return ZS_OK;
        }
    return zs_err_set(err, ZS_ERR_NOTFOUND, "checkpoint %llu is not complete on every server",
                      (unsigned long long)want);
}

/* Is complete checkpoint `step` what every server holds live? Sets *held to
 * the lowest applied step when not. */
static int holds(const zs_ctl_src_t *s, const zs_server_info_t *in, uint64_t *held)
{
    int ok = 1;
    *held = in[0].applied_step;
    for (int i = 0; i < s->S; i++) {
        if (in[i].applied_step != s->step || in[i].optimizer_step != s->adam_t ||
            in[i].num_params != s->P)
            ok = 0;
        if (in[i].applied_step < *held)
            *held = in[i].applied_step;
    }
    return ok;
}

/* Is `step` complete on every server? */
static int is_complete(zs_client_t *c, uint64_t step, zs_err_t *err)
{
    uint64_t got;
    return pick_step(c, step, &got, err) == ZS_OK;
}

int zs_ctl_src_open(zs_client_t *c, uint64_t want, int allow_restore, zs_ctl_src_t *s,
                    zs_err_t *err)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    s->S = zs_client_nservers(c);
    zs_server_info_t *in = calloc((size_t)s->S, sizeof *in);
    s->info = calloc((size_t)s->S, sizeof *s->info);
    s->meta = malloc(ZS_CLIENT_USER_META_MAX);
    if (!in || !s->info || !s->meta) {
        free(in);
        zs_ctl_src_close(s, NULL);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    int rc = hello_all(c, in, err);
    if (!rc)
        rc = pick_step(c, want, &s->step, err);
    if (!rc)
        rc = zs_client_checkpoint_info(c, s->step, s->info, s->meta, ZS_CLIENT_USER_META_MAX,
                                       &s->meta_len, err);
    if (!rc) {
        s->P = s->info[0].num_params;
        s->adam_t = s->info[0].optimizer_step;
    }
    uint64_t held = 0;
    if (!rc && !holds(s, in, &held)) {
        zs_err_t tmp;
        if (!allow_restore && held != s->step && is_complete(c, held, &tmp))
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "the servers hold checkpoint %llu, not %llu: pass --step %llu, or "
                            "--restore to read %llu (only while no trainer runs)",
                            (unsigned long long)held, (unsigned long long)s->step,
                            (unsigned long long)held, (unsigned long long)s->step);
        else if (!allow_restore)
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "the servers hold step %llu, not checkpoint %llu: reading tensors "
                            "reads their live state. Stop training, then pass --restore (or run "
                            "zs-ctl restore %llu first)",
                            (unsigned long long)held, (unsigned long long)s->step,
                            (unsigned long long)s->step);
        else if (!is_complete(c, held, &tmp))
            rc = zs_err_set(err, ZS_ERR_STATE,
                            "the servers hold step %llu, which is not a complete checkpoint: a "
                            "Restore of %llu would lose it (a trainer running?). Checkpoint or "
                            "stop it first",
                            (unsigned long long)held, (unsigned long long)s->step);
        else {
            ZS_INFO("restoring checkpoint %llu on the servers (they held %llu; restored back "
                    "at the end)",
                    (unsigned long long)s->step, (unsigned long long)held);
            rc = zs_client_restore(c, s->step, err);
            if (!rc)
                s->restore_back = held;
            if (!rc)
                rc = hello_all(c, in, err);
            if (!rc && !holds(s, in, &held))
                rc = zs_err_set(err, ZS_ERR_STATE,
                                "after restoring checkpoint %llu the servers hold step %llu",
                                (unsigned long long)s->step, (unsigned long long)held);
        }
    }
    free(in);
    if (rc) {
        zs_err_t tmp;
        zs_ctl_src_close(s, &tmp);
    }
    return rc;
}

int zs_ctl_src_read(zs_ctl_src_t *s, int tensor, uint64_t b, uint64_t e, float *dst, zs_err_t *err)
{
    uint64_t lo = 0, hi = 0;
    int rc = zs_client_get_state_step(s->c, tensor, b, e, dst, &lo, &hi, err);
    if (!rc && (lo != s->step || hi != s->step))
        rc = zs_err_set(err, ZS_ERR_STATE,
                        "the servers' state moved to step %llu while reading checkpoint %llu (a "
                        "trainer is running?)",
                        (unsigned long long)(lo != s->step ? lo : hi), (unsigned long long)s->step);
    return rc;
}

int zs_ctl_src_verify(zs_ctl_src_t *s, zs_err_t *err)
{
    zs_server_info_t *in = calloc((size_t)s->S, sizeof *in);
    if (!in)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    uint64_t held;
    int rc = hello_all(s->c, in, err);
    if (!rc && !holds(s, in, &held))
        rc = zs_err_set(err, ZS_ERR_STATE,
                        "the servers moved to step %llu while checkpoint %llu was read (a "
                        "trainer is running?)",
                        (unsigned long long)held, (unsigned long long)s->step);
    if (!rc && !is_complete(s->c, s->step, err))
        rc = zs_err_set(err, ZS_ERR_STATE, "checkpoint %llu was deleted while it was read",
                        (unsigned long long)s->step);
    free(in);
    return rc;
}

int zs_ctl_src_close(zs_ctl_src_t *s, zs_err_t *err)
{
    int rc = ZS_OK;
    if (s->restore_back) {
        rc = zs_client_restore(s->c, s->restore_back, err);
        if (rc == ZS_OK)
            ZS_INFO("restored checkpoint %llu back on the servers",
                    (unsigned long long)s->restore_back);
    }
    free(s->info);
    free(s->meta);
    memset(s, 0, sizeof *s);
    return rc;
}

int zs_ctl_src_run(const char *cmd, zs_client_t *c, uint64_t step, int restore,
                   zs_ctl_before_fn before, zs_ctl_run_fn run, void *ud)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    zs_err_t err;
    zs_err_clear(&err);
    zs_ctl_src_t s;
    int rc = before ? before(ud, &err) : ZS_OK;
    if (!rc)
        rc = zs_ctl_src_open(c, step, restore, &s, &err);
    if (!rc) {
        rc = run(&s, ud, &err);
        zs_err_t cerr;
        zs_err_clear(&cerr);
        if (zs_ctl_src_close(&s, &cerr) && !rc) {
            rc = cerr.code;
            err = cerr;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc)
        fprintf(stderr, "zs-ctl %s: %s\n", cmd, err.msg);
    else
        printf("%s: %.2f s, peak memory %.1f MiB\n", cmd,
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
               zs_ctl_peak_rss_mib());
    return rc ? 1 : 0;
}

int zs_ctl_parse_step(const char *cmd, const char *arg, uint64_t *step)
{
    char *end = NULL;
    *step = strtoull(arg, &end, 10);
    if (!*arg || *end || *step == 0) {
        fprintf(stderr, "zs-ctl %s: --step wants a positive step, not '%s'\n", cmd, arg);
        return 2;
    }
    return 0;
}
