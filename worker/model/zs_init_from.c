/*
 * zs_init_from.c - reading pretrained GPT-2 weights (zs_init_from.h):
 * safetensors (Hugging Face names, our export) and llm.c checkpoints,
 * mapped read-only; each of our tensors (zs_gpt_tensor order) is located
 * in the file once, at load, and converted to fp32 on request.
 *
 * Not here: the model wrapper that feeds the engine (zs_init_from_model.c).
 */
#define _GNU_SOURCE
#include "zs_init_from.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_cast.h"
#include "zs_init_from_impl.h"

#define SHOWN             200
#define ST_HEADER_MAX     (64ull << 20)
#define LLMC_MAGIC        20240326
#define MAX_LAYERS        4096
#define MAX_DIM           (1ll << 31)
#define ST_MAX_NAME_LAYER 100000

static const char *const k_block[12] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

/* Bytes of one element of F32 (4), BF16 or F16 (2). */
static size_t dt_size(int dt)
{
    return dt == ZS_DTYPE_F32 ? 4 : 2;
}

/* Little-endian u64 at p. */
static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Little-endian int32 at p. */
static int32_t rd32s(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* Map the file; fills f->map, f->len. */
static int map_file(const char *path, zs_init_from_t *f, zs_err_t *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return zs_err_set(err, e == ENOENT ? ZS_ERR_NOTFOUND : ZS_ERR_IO,
                          "--init-from %.*s: cannot open: %s", SHOWN, path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 16) {
        close(fd);
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: not a regular file of at least 16 bytes", SHOWN, path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return zs_err_set(err, ZS_ERR_IO, "--init-from %.*s: mmap failed: %s", SHOWN, path,
                          strerror(e));
    f->map = m;
    f->len = (uint64_t)st.st_size;
    return ZS_OK;
}

/* Our tensor index of a Hugging Face name (prefix "transformer." optional),
 * -1 if none, -2 if the name is one that is ignored. *layer gets the block
 * for block tensors (index then 2 + 12 * layer + k, with L unknown yet:
 * returned as k in *k and -3). */
static int hf_index(const char *name, int *layer, int *k)
{
    static const char *const ignored_suffix[] = {".exp_avg", ".exp_avg_sq", ".attn.bias",
                                                 ".attn.masked_bias"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ignored_suffix / sizeof *ignored_suffix; i++) {
        size_t s = strlen(ignored_suffix[i]);
        if (n > s && strcmp(name + n - s, ignored_suffix[i]) == 0)
            return -2;
    }
    if (strcmp(name, "lm_head.weight") == 0)
        return -2;
    if (strncmp(name, "transformer.", 12) == 0)
        name += 12;
    if (strcmp(name, "wte.weight") == 0)
        return 0;
    if (strcmp(name, "wpe.weight") == 0)
        return 1;
    if (strcmp(name, "ln_f.weight") == 0)
        return -4;
    if (strcmp(name, "ln_f.bias") == 0)
        return -5;
    int l, used = 0;
    if (sscanf(name, "h.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < ST_MAX_NAME_LAYER)
        for (int i = 0; i < 12; i++)
            if (strcmp(name + used, k_block[i]) == 0) {
                *layer = l;
                *k = i;
                return -3;
            }
    return -1;
}

typedef struct st_entry {
    int idx, layer, k; /* hf_index's answer */
    zs__init_src_t src;
    int64_t shape[2];
    int ndim;
    char name[96];
} st_entry_t;

/* Check the tensor table against the shape (L, C, T, V) it implies. */
static int check_shapes(const char *path, zs_init_from_t *f, const st_entry_t *e, int n,
                        zs_err_t *err)
{
    zs_gpt_config_t c = f->shape;
    c.heads = 1;
    for (int j = 0; j < n; j++) {
        if (e[j].idx < 0)
            continue;
        zs_gpt_tensor_t t;
        zs_gpt_tensor(&c, e[j].idx, &t);
        int ok = t.rows == 1 ? e[j].ndim == 1 && (uint64_t)e[j].shape[0] == t.cols
                             : e[j].ndim == 2 && (uint64_t)e[j].shape[0] == t.rows &&
                                   (uint64_t)e[j].shape[1] == t.cols;
        if (!ok)
            return zs_err_set(
                err, ZS_ERR_CORRUPT,
                "--init-from %.*s: tensor %s has shape [%lld%s%lld], a GPT-2 of "
                "%d layers, width %d, %d positions, vocab %d needs [%llu, %llu]",
                SHOWN, path, e[j].name, (long long)e[j].shape[0], e[j].ndim == 2 ? ", " : "",
                e[j].ndim == 2 ? (long long)e[j].shape[1] : 0LL, c.layers, c.width, c.ctx, c.vocab,
                (unsigned long long)t.rows, (unsigned long long)t.cols);
        f->src[e[j].idx] = e[j].src;
    }
    int nt = zs_gpt_num_tensors(&c);
    for (int i = 0; i < nt; i++)
        if (!f->src[i].p) {
            char hf[64];
            if (i < 2)
                snprintf(hf, sizeof hf, "%s.weight", i ? "wpe" : "wte");
            else if (i < nt - 2)
                snprintf(hf, sizeof hf, "h.%d.%s", (i - 2) / 12, k_block[(i - 2) % 12]);
            else
                snprintf(hf, sizeof hf, "ln_f.%s", i == nt - 2 ? "weight" : "bias");
            return zs_err_set(err, ZS_ERR_CORRUPT,
                              "--init-from %.*s: tensor [transformer.]%s is missing", SHOWN, path,
                              hf);
        }
    return ZS_OK;
}

/* The heads of our export's metadata ("zeroshard.model": the manifest's
 * model object as a string), 0 if absent. */
static int st_heads(const cJSON *root)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(meta, "zeroshard.model");
    if (!cJSON_IsString(model))
        return 0;
    cJSON *m = cJSON_Parse(model->valuestring);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(m, "config");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(cfg, "n_head");
    int heads = cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble < 65536
                    ? (int)h->valuedouble
                    : 0;
    cJSON_Delete(m);
    return heads;
}

/* The GPT-2 vocabulary our export's metadata names ("tokenizer" in
 * "zeroshard.model": zs_gpt_manifest_bpe) into f; absent or malformed is
 * no record (the weights load either way). */
static void st_bpe(const cJSON *root, zs_init_from_t *f)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(meta, "zeroshard.model");
    if (!cJSON_IsString(model))
        return;
    cJSON *m = cJSON_Parse(model->valuestring);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "tokenizer");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(t, "vocab_dir");
    const cJSON *enc = cJSON_GetObjectItemCaseSensitive(t, "encoder_xxh3");
    const cJSON *mer = cJSON_GetObjectItemCaseSensitive(t, "merges_xxh3");
    unsigned long long e = 0, r = 0;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "gpt2-bpe") == 0 && cJSON_IsString(dir) &&
        *dir->valuestring && strlen(dir->valuestring) < sizeof f->bpe.dir && cJSON_IsString(enc) &&
        sscanf(enc->valuestring, "%16llx", &e) == 1 && cJSON_IsString(mer) &&
        sscanf(mer->valuestring, "%16llx", &r) == 1) {
        snprintf(f->bpe.dir, sizeof f->bpe.dir, "%s", dir->valuestring);
        f->bpe.encoder_xxh3 = e;
        f->bpe.merges_xxh3 = r;
        f->has_bpe = 1;
    }
    cJSON_Delete(m);
}

/* The vocabulary the file's metadata names, NULL if none (zs_init_from.h). */
const zs_data_bpe_t *zs_init_from_bpe(const zs_init_from_t *f)
{
    return f->has_bpe ? &f->bpe : NULL;
}

/* Parse a safetensors header and locate every GPT-2 tensor (zs_init_from.h). */
static int load_safetensors(const char *path, zs_init_from_t *f, zs_err_t *err)
{
    uint64_t n = rd64(f->map);
    if (n > f->len - 8 || n > ST_HEADER_MAX)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: safetensors header of %llu bytes does not fit the "
                          "%llu-byte file (or exceeds 64 MiB)",
                          SHOWN, path, (unsigned long long)n, (unsigned long long)f->len);
    char *text = malloc(n + 1);
    if (!text)
        return zs_err_set(err, ZS_ERR_NOMEM, "--init-from: out of memory");
    memcpy(text, f->map + 8, n);
    text[n] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: neither an llm.c checkpoint (magic 20240326) nor "
                          "safetensors (its JSON header does not parse)",
                          SHOWN, path);
    }
    const uint8_t *data = f->map + 8 + n;
    uint64_t data_len = f->len - 8 - n;
    int count = cJSON_GetArraySize(root), ne = 0, rc = ZS_OK, maxl = -1;
    st_entry_t *e = calloc((size_t)count + 1, sizeof *e);
    int lnf[2] = {-1, -1};
    if (!e)
        rc = zs_err_set(err, ZS_ERR_NOMEM, "--init-from: out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (rc != ZS_OK)
            break;
        if (strcmp(it->string, "__metadata__") == 0)
            continue;
        st_entry_t *x = &e[ne];
        snprintf(x->name, sizeof x->name, "%s", it->string);
        x->idx = hf_index(it->string, &x->layer, &x->k);
        if (x->idx == -2)
            continue;
        if (x->idx == -1) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "--init-from %.*s: tensor %.80s is not part of a GPT-2", SHOWN, path,
                            it->string);
            break;
        }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        const char *d = cJSON_IsString(dt) ? dt->valuestring : "";
        x->src.dt = !strcmp(d, "F32")    ? ZS_DTYPE_F32
                    : !strcmp(d, "BF16") ? ZS_DTYPE_BF16
                    : !strcmp(d, "F16")  ? ZS_DTYPE_F16
                                         : -1;
        x->ndim = cJSON_GetArraySize(shape);
        uint64_t numel = 1;
        int bad = x->src.dt < 0 || !cJSON_IsArray(shape) || x->ndim < 1 || x->ndim > 2 ||
                  cJSON_GetArraySize(off) != 2;
        for (int k = 0; !bad && k < x->ndim; k++) {
            double v = cJSON_GetArrayItem(shape, k)->valuedouble;
            bad = !(v >= 1 && v < (double)MAX_DIM);
            x->shape[k] = bad ? 0 : (int64_t)v;
            numel *= bad ? 1 : (uint64_t)x->shape[k];
        }
        double b = bad ? 0 : cJSON_GetArrayItem(off, 0)->valuedouble;
        double en = bad ? 0 : cJSON_GetArrayItem(off, 1)->valuedouble;
        if (bad || !(b >= 0 && en >= b && en <= (double)data_len) ||
            (uint64_t)en - (uint64_t)b != numel * dt_size(x->src.dt)) {
            rc = zs_err_set(err, ZS_ERR_CORRUPT,
                            "--init-from %.*s: tensor %.80s: dtype %s (F32, BF16, F16 are read), "
                            "shape or data_offsets are not valid for the %llu data bytes",
                            SHOWN, path, it->string, d, (unsigned long long)data_len);
            break;
        }
        x->src.p = data + (uint64_t)b;
        x->src.rows = x->ndim == 2 ? (uint64_t)x->shape[0] : 1;
        x->src.cols = (uint64_t)x->shape[x->ndim - 1];
        if (x->idx == -3 && x->layer > maxl)
            maxl = x->layer;
        if (x->idx <= -4)
            lnf[-4 - x->idx] = ne;
        ne++;
    }
    int L = maxl + 1;
    const st_entry_t *wte = NULL, *wpe = NULL;
    for (int j = 0; j < ne; j++) {
        if (e[j].idx == 0)
            wte = &e[j];
        if (e[j].idx == 1)
            wpe = &e[j];
    }
    if (rc == ZS_OK && (L < 1 || L > MAX_LAYERS || !wte || !wpe || wte->ndim != 2 ||
                        wpe->ndim != 2 || lnf[0] < 0 || lnf[1] < 0))
        rc = zs_err_set(err, ZS_ERR_CORRUPT,
                        "--init-from %.*s: not a whole GPT-2: needs wte, wpe [rows, width], "
                        "ln_f and 1..%d blocks h.N (found %d)",
                        SHOWN, path, MAX_LAYERS, L);
    if (rc == ZS_OK) {
        f->shape = (zs_gpt_config_t){L, st_heads(root), (int)wte->shape[1], (int)wpe->shape[0],
                                     (int)wte->shape[0]};
        st_bpe(root, f);
        int nt = zs_gpt_num_tensors(&f->shape);
        for (int j = 0; j < ne; j++) { /* the final index of block and ln_f tensors */
            if (e[j].idx == -3)
                e[j].idx = 2 + 12 * e[j].layer + e[j].k;
            else if (e[j].idx <= -4)
                e[j].idx = nt - 2 + (-4 - e[j].idx);
        }
        f->src = calloc((size_t)nt, sizeof *f->src);
        if (!f->src)
            rc = zs_err_set(err, ZS_ERR_NOMEM, "--init-from: out of memory");
        for (int j = 0; rc == ZS_OK && j < ne; j++)
            for (int k = 0; k < j; k++)
                if (e[k].idx == e[j].idx)
                    rc = zs_err_set(err, ZS_ERR_CORRUPT,
                                    "--init-from %.*s: %s and %s are the same tensor", SHOWN, path,
                                    e[k].name, e[j].name);
        if (rc == ZS_OK)
            rc = check_shapes(path, f, e, ne, err);
    }
    free(e);
    cJSON_Delete(root);
    snprintf(f->format, sizeof f->format, "safetensors");
    return rc;
}

/* Check an llm.c checkpoint header and size and locate its 16 arrays. */
static int load_llmc(const char *path, zs_init_from_t *f, zs_err_t *err)
{
    if (f->len < 1024)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: llm.c checkpoint shorter than its 1024-byte header",
                          SHOWN, path);
    const uint8_t *h = f->map;
    int32_t version = rd32s(h + 4), maxT = rd32s(h + 8), V = rd32s(h + 12), L = rd32s(h + 16),
            NH = rd32s(h + 20), C = rd32s(h + 24), Vp = rd32s(h + 28);
    if (version != 3 && version != 5)
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: llm.c checkpoint version %d; 3 (fp32) and 5 (bf16) "
                          "are read",
                          SHOWN, path, version);
    if (maxT < 1 || V < 1 || L < 1 || L > MAX_LAYERS || NH < 1 || C < 1 || C % NH || Vp < V ||
        maxT > (1 << 24) || Vp > (1 << 24) || C > (1 << 20))
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: llm.c header max_seq_len %d, vocab %d, layers %d, "
                          "heads %d, channels %d, padded vocab %d is not a GPT-2",
                          SHOWN, path, maxT, V, L, NH, C, Vp);
    int dt = version == 3 ? ZS_DTYPE_F32 : ZS_DTYPE_BF16;
    uint64_t c = (uint64_t)C, l = (uint64_t)L;
    /* llm.c's 16 arrays: element counts, in file order */
    const uint64_t sizes[16] = {(uint64_t)Vp * c,
                                (uint64_t)maxT * c,
                                l * c,
                                l * c,
                                l * 3 * c * c,
                                l * 3 * c,
                                l * c * c,
                                l * c,
                                l * c,
                                l * c,
                                l * 4 * c * c,
                                l * 4 * c,
                                l * c * 4 * c,
                                l * c,
                                c,
                                c};
    uint64_t total = 0, off[16];
    for (int i = 0; i < 16; i++) {
        off[i] = total;
        total += sizes[i];
    }
    if (f->len != 1024 + total * dt_size(dt))
        return zs_err_set(err, ZS_ERR_CORRUPT,
                          "--init-from %.*s: llm.c checkpoint of %llu bytes; its header needs "
                          "1024 + %llu parameters x %zu bytes (%s)",
                          SHOWN, path, (unsigned long long)f->len, (unsigned long long)total,
                          dt_size(dt),
                          f->len < 1024 + total * dt_size(dt) ? "truncated" : "trailing data");
    f->shape = (zs_gpt_config_t){L, NH, C, maxT, V};
    int nt = zs_gpt_num_tensors(&f->shape);
    f->src = calloc((size_t)nt, sizeof *f->src);
    if (!f->src)
        return zs_err_set(err, ZS_ERR_NOMEM, "--init-from: out of memory");
    const uint8_t *base = f->map + 1024;
    size_t es = dt_size(dt);
    f->src[0] = (zs__init_src_t){base, dt, (uint64_t)V, c, 0}; /* wte: first V of Vp rows */
    f->src[1] = (zs__init_src_t){base + off[1] * es, dt, (uint64_t)maxT, c, 0};
    /* our block order -> llm.c array (2..13), and whether it is a [out, in] matrix */
    static const int arr[12] = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    static const int mat[12] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0};
    zs_gpt_config_t one = f->shape;
    for (int b = 0; b < L; b++)
        for (int k = 0; k < 12; k++) {
            zs_gpt_tensor_t t;
            zs_gpt_tensor(&one, 2 + 12 * b + k, &t);
            uint64_t per = sizes[arr[k]] / l;
            f->src[2 + 12 * b + k] = (zs__init_src_t){base + (off[arr[k]] + (uint64_t)b * per) * es,
                                                      dt, t.rows, t.cols, mat[k]};
        }
    f->src[nt - 2] = (zs__init_src_t){base + off[14] * es, dt, 1, c, 0};
    f->src[nt - 1] = (zs__init_src_t){base + off[15] * es, dt, 1, c, 0};
    snprintf(f->format, sizeof f->format, "llm.c");
    return ZS_OK;
}

/* Map a weights file and read it by its first bytes (zs_init_from.h). */
int zs_init_from_load(const char *path, zs_init_from_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_init_from_t *f = calloc(1, sizeof *f);
    if (!f)
        return zs_err_set(err, ZS_ERR_NOMEM, "--init-from: out of memory");
    int rc = map_file(path, f, err);
    if (rc == ZS_OK)
        rc = rd32s(f->map) == LLMC_MAGIC ? load_llmc(path, f, err) : load_safetensors(path, f, err);
    if (rc != ZS_OK) {
        zs_init_from_free(f);
        return rc;
    }
    *out = f;
    return ZS_OK;
}

/* Unmap and free (NULL is fine). */
void zs_init_from_free(zs_init_from_t *f)
{
    if (!f)
        return;
    if (f->map)
        munmap((void *)f->map, f->len);
    free(f->src);
    free(f);
}

/* The file's shape (heads 0 if it does not say). */
zs_gpt_config_t zs_init_from_shape(const zs_init_from_t *f)
{
    return f->shape;
}

/* "safetensors" or "llm.c". */
const char *zs_init_from_format(const zs_init_from_t *f)
{
    return f->format;
}

/* Settle the model config from the file and the flags given (zs_init_from.h). */
int zs_init_from_settle(const zs_init_from_t *f, zs_gpt_config_t *c, int given_layers,
                        int given_width, int given_heads, int given_ctx, uint32_t data_vocab,
                        zs_err_t *err)
{
    const zs_gpt_config_t s = f->shape;
    if (given_layers && c->layers != s.layers)
        return zs_err_set(err, ZS_ERR_INVALID, "--layers %d disagrees with the %d layers of %s",
                          c->layers, s.layers, f->format);
    if (given_width && c->width != s.width)
        return zs_err_set(err, ZS_ERR_INVALID, "--width %d disagrees with the width %d of %s",
                          c->width, s.width, f->format);
    if (given_heads && s.heads && c->heads != s.heads)
        return zs_err_set(err, ZS_ERR_INVALID, "--heads %d disagrees with the %d heads of %s",
                          c->heads, s.heads, f->format);
    if (given_ctx && (c->ctx > s.ctx || c->ctx < 2))
        return zs_err_set(err, ZS_ERR_INVALID,
                          "--ctx %d: the %s file has %d positions (--ctx may be 2..%d)", c->ctx,
                          f->format, s.ctx, s.ctx);
    if (data_vocab != (uint32_t)s.vocab)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "the data's vocab %u differs from the %s file's vocab %d", data_vocab,
                          f->format, s.vocab);
    c->layers = s.layers;
    c->width = s.width;
    c->vocab = s.vocab;
    if (!given_ctx)
        c->ctx = s.ctx;
    if (s.heads)
        c->heads = s.heads;
    else if (!given_heads) {
        if (s.width % 64)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "the %s file does not say its heads and width %d is not a multiple "
                              "of GPT-2's head size 64: pass --heads",
                              f->format, s.width);
        c->heads = s.width / 64;
    }
    if (c->width % c->heads)
        return zs_err_set(err, ZS_ERR_INVALID, "--heads %d does not divide the width %d", c->heads,
                          c->width);
    return ZS_OK;
}

/* Element i of a source as fp32. */
static float elem(const zs__init_src_t *s, uint64_t i)
{
    const uint8_t *p = s->p + i * dt_size(s->dt);
    if (s->dt == ZS_DTYPE_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return s->dt == ZS_DTYPE_BF16 ? zs_bf16_to_f32(h) : zs_f16_to_f32(h);
}

/* Tensor i of a settled config as fp32 (a copy when F32 and not transposed). */
int zs_init_from_tensor(const zs_init_from_t *f, const zs_gpt_config_t *c, int i, float *out,
                        zs_err_t *err)
{
    zs_gpt_tensor_t t;
    if (zs_gpt_tensor(c, i, &t) != ZS_OK || c->layers != f->shape.layers ||
        c->width != f->shape.width || c->vocab != f->shape.vocab || c->ctx > f->shape.ctx)
        return zs_err_set(err, ZS_ERR_INVALID, "--init-from: tensor %d of a config not settled", i);
    const zs__init_src_t *s = &f->src[i];
    if (!s->transposed && s->dt == ZS_DTYPE_F32) { /* rows are contiguous: a copy (bitwise) */
        memcpy(out, s->p, t.numel * sizeof *out);
        return ZS_OK;
    }
    for (uint64_t r = 0; r < t.rows; r++)
        for (uint64_t k = 0; k < t.cols; k++)
            out[r * t.cols + k] = elem(s, s->transposed ? k * t.rows + r : r * t.cols + k);
    return ZS_OK;
}
