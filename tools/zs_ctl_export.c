/*
 * zs_ctl_export.c - zs-ctl export: a checkpoint's weights (and with
 * --optimizer its Adam moments) from all its servers into one safetensors
 * file, with the tensor names and shapes of the model manifest the
 * checkpoint carries (zs_ctl_manifest.c), so no model code is needed.
 *
 *   zs-ctl export --servers a:p,b:p [--step S] [--restore] --out model.safetensors
 *          [--dtype fp32|bf16|fp16] [--optimizer]
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [b, e)}}
 * with e - b = numel * dtype size, padded with spaces to a multiple of 8),
 * then the data, little-endian, row-major. The manifest gives every shape
 * and size up front, so the header is written first and the data streamed
 * after it in file order: weights in flat-offset order (a run of tensors
 * adjacent in the flat space is read in ZS_CTL_CHUNK pieces across tensor
 * boundaries), then exp_avg and exp_avg_sq (always F32, named
 * "<name>.exp_avg" / "<name>.exp_avg_sq"). Memory: one chunk of fp32 and
 * one of the output dtype, plus the header (about 100 bytes a tensor),
 * whatever the model's size. bf16/fp16 round to nearest even (zs_cast.h).
 * The file is written as OUT.part and renamed to OUT once complete and
 * synced, so OUT is never a partial export.
 *
 * Which state is read, and when the servers are changed (--restore only):
 * zs_ctl.h.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_ctl.h"
#include "zs_strbuf.h"

typedef struct {
    const char *servers, *token_file, *ca_file, *out;
    uint64_t step;
    zs_dtype_t dt;
    int optimizer, restore;
} export_opts_t;

static const char *st_dtype(zs_dtype_t dt)
{
    return dt == ZS_DTYPE_BF16 ? "BF16" : dt == ZS_DTYPE_F16 ? "F16" : "F32";
}

/* The header: metadata, then every tensor of every exported state in file
 * order, padded to a multiple of 8 bytes. Returns the data bytes in *total. */
static int build_header(const zs_ctl_src_t *s, const zs_engine_ckpt_meta_t *em,
                        const zs_ctl_manifest_t *m, const export_opts_t *o, zs_strbuf_t *h,
                        uint64_t *total, zs_err_t *err)
{
    static const char *const suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};
    zs_strbuf_addf(
        h,
        "{\"__metadata__\":{\"format\":\"pt\",\"zeroshard.step\":\"%llu\","
        "\"zeroshard.adam_t\":\"%llu\",\"zeroshard.servers\":\"%d\",\"zeroshard.model\":",
        (unsigned long long)em->step, (unsigned long long)s->adam_t, s->S);
    zs_strbuf_add_json_string(h, m->model_json);
    zs_strbuf_addf(h, "}");
    uint64_t off = 0;
    for (int x = 0; x < (o->optimizer ? 3 : 1); x++) {
        zs_dtype_t dt = x == 0 ? o->dt : ZS_DTYPE_F32;
        for (int i = 0; i < m->n; i++) {
            const zs_ctl_tensor_t *t = &m->t[i];
            uint64_t bytes = t->numel * zs_dtype_size(dt);
            zs_strbuf_addf(h, ",\"%s%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, suffix[x],
                           st_dtype(dt));
            for (int d = 0; d < t->ndim; d++)
                zs_strbuf_addf(h, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
            zs_strbuf_addf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                           (unsigned long long)(off + bytes));
            off += bytes;
        }
    }
    zs_strbuf_addf(h, "}");
    while (!h->oom && h->len % 8)
        zs_strbuf_addf(h, " ");
    *total = off;
    return h->oom ? zs_err_set(err, ZS_ERR_NOMEM, "out of memory for the header") : ZS_OK;
}

/* Stream state `tensor` of every manifest tensor, in offset order, to f as
 * dtype dt: runs of flat-adjacent tensors are read in chunks. */
static int write_state(zs_ctl_src_t *s, const zs_ctl_manifest_t *m, int tensor, zs_dtype_t dt,
                       float *buf, void *cbuf, FILE *f, zs_err_t *err)
{
    size_t esz = zs_dtype_size(dt);
    for (int i = 0; i < m->n;) {
        uint64_t b = m->t[i].offset, e = b + m->t[i].numel;
        for (i++; i < m->n && m->t[i].offset == e; i++)
            e += m->t[i].numel;
        for (uint64_t at = b; at < e;) {
            uint64_t k = e - at < ZS_CTL_CHUNK ? e - at : ZS_CTL_CHUNK;
            int rc = zs_ctl_src_read(s, tensor, at, at + k, buf, err);
            if (rc)
                return rc;
            const void *w = buf;
            if (dt != ZS_DTYPE_F32) {
                zs_cast(cbuf, dt, buf, ZS_DTYPE_F32, (size_t)k);
                w = cbuf;
            }
            if (fwrite(w, esz, (size_t)k, f) != (size_t)k)
                return zs_err_set(err, ZS_ERR_IO, "write failed");
            at += k;
        }
    }
    return ZS_OK;
}

static int export_file(zs_ctl_src_t *s, const export_opts_t *o, zs_err_t *err)
{
    zs_engine_ckpt_meta_t em;
    int rc = zs_engine_meta_parse(s->meta, s->meta_len, &em, err);
    if (rc)
        return zs_err_prefix(err, "checkpoint %llu: ", (unsigned long long)s->step);
    if (em.step != s->step)
        return zs_err_set(err, ZS_ERR_CORRUPT, "checkpoint %llu: the engine's state says step %llu",
                          (unsigned long long)s->step, (unsigned long long)em.step);
    if (!em.manifest)
        return zs_err_set(err, ZS_ERR_NOTFOUND,
                          "checkpoint %llu carries no model manifest (written before manifests "
                          "existed, or by a model that gives none): nothing says which tensors "
                          "the parameters are",
                          (unsigned long long)s->step);
    zs_ctl_manifest_t m;
    rc = zs_ctl_manifest_parse(em.manifest, em.manifest_len, s->P, &m, err);
    if (rc)
        return zs_err_prefix(err, "checkpoint %llu: ", (unsigned long long)s->step);
    zs_strbuf_t h = {0};
    uint64_t total = 0;
    rc = build_header(s, &em, &m, o, &h, &total, err);
    char part[4096];
    snprintf(part, sizeof part, "%s.part", o->out);
    FILE *f = NULL;
    if (!rc && !(f = fopen(part, "wb")))
        rc = zs_err_set(err, ZS_ERR_IO, "cannot create %s", part);
    float *buf = rc ? NULL : malloc(ZS_CTL_CHUNK * sizeof(float));
    void *cbuf = rc ? NULL : malloc(ZS_CTL_CHUNK * 2);
    if (!rc && (!buf || !cbuf))
        rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    if (!rc) {
        uint8_t n8[8];
        for (int i = 0; i < 8; i++)
            n8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
        if (fwrite(n8, 1, 8, f) != 8 || fwrite(h.p, 1, h.len, f) != h.len)
            rc = zs_err_set(err, ZS_ERR_IO, "cannot write %s", part);
    }
    for (int x = 0; !rc && x < (o->optimizer ? 3 : 1); x++)
        rc = write_state(s, &m, x, x == 0 ? o->dt : ZS_DTYPE_F32, buf, cbuf, f, err);
    if (!rc)
        rc = zs_ctl_src_verify(s, err);
    if (f && !rc && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        rc = zs_err_set(err, ZS_ERR_IO, "cannot write %s", part);
    if (f && fclose(f) != 0 && !rc)
        rc = zs_err_set(err, ZS_ERR_IO, "cannot write %s", part);
    if (f && !rc && rename(part, o->out) != 0)
        rc = zs_err_set(err, ZS_ERR_IO, "cannot rename %s to %s", part, o->out);
    if (f && rc)
        unlink(part);
    if (!rc)
        printf("export: checkpoint %llu (Adam t %llu) of %d servers: %d tensors, %llu parameters "
               "as %s%s -> %s (%.1f MB)\n",
               (unsigned long long)s->step, (unsigned long long)s->adam_t, s->S, m.n,
               (unsigned long long)s->P, st_dtype(o->dt),
               o->optimizer ? " + exp_avg, exp_avg_sq (F32)" : "", o->out,
               (double)(8 + h.len + total) / 1e6);
    free(buf);
    free(cbuf);
    free(h.p);
    zs_ctl_manifest_free(&m);
    return rc;
}

/* zs_ctl_run_fn of export: ud is the export_opts_t. */
static int export_run(zs_ctl_src_t *s, void *ud, zs_err_t *err)
{
    return export_file(s, ud, err);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-ctl export --servers HOST:PORT[,...] --out FILE.safetensors\n"
               "              [--step S] [--dtype fp32|bf16|fp16] [--optimizer] [--restore]\n"
               "              [--token-file F] [--tls-ca F]\n"
               "  --step S      checkpoint to export (default: the newest complete one)\n"
               "  --dtype D     weights as fp32 (default), bf16 or fp16 (round to nearest even)\n"
               "  --optimizer   also exp_avg and exp_avg_sq (fp32), as <name>.exp_avg[_sq]\n"
               "  --restore     if the servers hold another step: Restore S first and restore\n"
               "                what they held after (only while no trainer runs)\n");
}

int zs_ctl_export_main(int argc, char **argv)
{
    export_opts_t o = {0};
    o.dt = ZS_DTYPE_F32;
    static const struct option lo[] = {{"servers", 1, 0, 's'},   {"token-file", 1, 0, 't'},
                                       {"tls-ca", 1, 0, 'c'},    {"step", 1, 0, 'S'},
                                       {"out", 1, 0, 'o'},       {"dtype", 1, 0, 'd'},
                                       {"optimizer", 0, 0, 'O'}, {"restore", 0, 0, 'R'},
                                       {"help", 0, 0, 'h'},      {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 's':
            o.servers = optarg;
            break;
        case 't':
            o.token_file = optarg;
            break;
        case 'c':
            o.ca_file = optarg;
            break;
        case 'S':
            if (zs_ctl_parse_step("export", optarg, &o.step))
                return 2;
            break;
        case 'o':
            o.out = optarg;
            break;
        case 'd':
            if (!strcmp(optarg, "fp32") || !strcmp(optarg, "f32"))
                o.dt = ZS_DTYPE_F32;
            else if (!strcmp(optarg, "bf16"))
                o.dt = ZS_DTYPE_BF16;
            else if (!strcmp(optarg, "fp16") || !strcmp(optarg, "f16"))
                o.dt = ZS_DTYPE_F16;
            else {
                fprintf(stderr, "zs-ctl export: --dtype is fp32, bf16 or fp16, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'O':
            o.optimizer = 1;
            break;
        case 'R':
            o.restore = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!o.servers || !o.out || optind < argc || strlen(o.out) > 4000) {
        usage(stderr);
        return 2;
    }
    zs_client_t *c;
    if (zs_ctl_connect(o.servers, o.token_file, o.ca_file, &c))
        return 1;
    int st = zs_ctl_src_run("export", c, o.step, o.restore, NULL, export_run, &o);
    zs_client_destroy(c);
    return st;
}
