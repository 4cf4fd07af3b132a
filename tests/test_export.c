/*
 * test_export.c - zs-ctl export and reshard (tools/zs_ctl_export.c,
 * zs_ctl_reshard.c) end to end, with real zs-server processes, zs-train
 * under MPI and an independent reader (tests/ref/export_check.py: python3
 * with numpy and torch, no safetensors library):
 *
 *  0. unit: the GPT's manifest (zs_gpt_manifest) parses with the exporter's
 *     validator and gives zs_gpt_tensor's offsets and shapes; malformed
 *     manifests and engine states from a server are refused one by one.
 *  1. zs-train (2 servers, 2 workers) trains a small GPT 6 steps and
 *     checkpoints; --save-params keeps the CPU model's final weights.
 *  2. export fp32, bf16, fp16 and fp32 + optimizer. The reader checks the
 *     files (header, Hugging Face GPT-2 names and shapes, packing, bf16/fp16
 *     = fp32 rounded to nearest even), rebuilds the flat weights (must equal
 *     --save-params bitwise; moments must equal the servers' GetState
 *     bitwise) and runs tests/ref/gpt_torch.py's GPT on the exported tensors:
 *     its logits on fixed tokens must match the C model's on the saved
 *     weights (abs + rel tolerance, max error printed).
 *  3. reshard 2 -> 3 -> 1 servers. A target that is a source is refused; a
 *     corrupted chunk (ZS_CTL_DEBUG_CORRUPT) fails the end-to-end checksum and
 *     leaves the target without a checkpoint. Then training resumes to step
 *     10 on the 1 server and on the original 2: the final weights are
 *     bitwise equal. The source was not touched (its export is unchanged);
 *     export refuses servers that moved past the checkpoint.
 *  4. memory: a 25M-parameter GPT (100 MB of fp32, 100x the 1 MiB chunk)
 *     written straight onto 2 servers; the exporter's peak RSS (its VmHWM) must
 *     stay under half the model (printed); the reader checks every value.
 *     The same for reshard 2 -> 1 (master + moments) and an export of the
 *     target. Checkpoints without a manifest or with foreign client state
 *     are refused; user_meta at its 60 KiB limit passes Checkpoint,
 *     GetCheckpointMeta and Restore, one byte more is refused; --step of an
 *     older checkpoint needs --restore, after which the servers hold what
 *     they held before.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_ctl.h"
#include "zs_dev.h"
#include "zs_gpt.h"
#include "zs_loss_scale.h"
#include "zs_proc.h"
#include "zs_test.h"

#define CTL ZS_CTL

static char g_tmp[200], g_data[300];
static const zs_gpt_config_t k_cfg = {2, 4, 64, 32, 256}; /* what zs-train builds below */

/* mpirun -np W zs-train ARGS on `servers`; exits the test on failure. */
static void train(int W, const char *servers, const char *args)
{
    char log[300];
    snprintf(log, sizeof log, "%s/train.log", g_tmp);
    zs_test_run_ok(log,
                   "ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS " -np %d %s --data %s --servers %s "
                   "--layers %d --heads %d --width %d --ctx %d %s",
                   ZS_MPIEXEC, W, ZS_TRAIN, g_data, servers, k_cfg.layers, k_cfg.heads, k_cfg.width,
                   k_cfg.ctx, args);
}

/* zs-ctl ARGS, output to DIR/ctl.log; returns its exit code. */
static int ctl(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int ctl(const char *fmt, ...)
{
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return zs_test_sh("ZS_LOG_LEVEL=warn %s %s > %s/ctl.log 2>&1", CTL, args, g_tmp);
}

/* Does DIR/ctl.log contain `what`? */
static int ctl_said(const char *what)
{
    return zs_test_sh("grep -qF -- '%s' %s/ctl.log", what, g_tmp) == 0;
}

static void ctl_ok(const char *what, int rc)
{
    if (rc) {
        fprintf(stderr, "FAIL: zs-ctl %s exited %d:\n", what, rc);
        zs_test_sh("cat %s/ctl.log >&2", g_tmp);
        exit(1);
    }
}

static float *read_floats(const char *path, uint64_t n)
{
    FILE *f = fopen(path, "rb");
    TEST_CHECKF(f, "cannot open %s", path);
    float *p = malloc(n * sizeof *p + 1);
    TEST_CHECK(p);
    size_t got = fread(p, sizeof *p, n + 1, f);
    fclose(f);
    TEST_CHECKF(got == n, "%s holds %zu floats, expected %llu", path, got, (unsigned long long)n);
    return p;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

/* n fresh servers (data dirs g_tmp/TAG0.., --keep 4); list into `list`. */
static void start_servers(zs_test_server_t *s, int n, const char *tag, char *list, size_t cap)
{
    zs_test_servers_up(s, n, g_tmp, tag, "--keep 4", list, cap);
}

static zs_client_t *client(const char *servers)
{
    zs_client_opts_t o = {servers, NULL, NULL, 60000, 2};
    zs_client_t *c;
    zs_err_t err;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    TEST_OK(zs_client_hello(c, "", 0, NULL, &err), err);
    return c;
}

/* The engine's checkpoint state (zs_engine_ckpt.c's layout): "ZSE1", step,
 * Adam t, a default loss scaler, then (manifest != NULL) its length and
 * text. Returns the length; *out malloc'd. */
static size_t engine_meta(uint64_t step, uint64_t t, const char *manifest, uint8_t **out)
{
    size_t fixed = 4 + 8 + 8 + ZS_LOSS_SCALE_BYTES, ml = manifest ? strlen(manifest) : 0;
    size_t len = fixed + (manifest ? 4 + ml : 0);
    uint8_t *p = calloc(1, len);
    TEST_CHECK(p);
    const uint32_t magic = 0x3145535au;
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(magic >> (8 * i));
    for (int i = 0; i < 8; i++) {
        p[4 + i] = (uint8_t)(step >> (8 * i));
        p[12 + i] = (uint8_t)(t >> (8 * i));
    }
    zs_loss_scale_t ls;
    zs_loss_scale_init(&ls, NULL);
    zs_loss_scale_save(&ls, p + 20);
    if (manifest) {
        for (int i = 0; i < 4; i++)
            p[fixed + i] = (uint8_t)(ml >> (8 * i));
        memcpy(p + fixed + 4, manifest, ml);
    }
    *out = p;
    return len;
}

/* ---- 0. manifests and engine state, refused when malformed -------------- */

static void test_unit(void)
{
    zs_err_t err;
    char *man;
    TEST_OK(zs_gpt_manifest(&k_cfg, "zs-gpt", &man, &err), err);
    uint64_t P = zs_gpt_num_params(&k_cfg);
    zs_ctl_manifest_t m;
    TEST_OK(zs_ctl_manifest_parse(man, strlen(man), P, &m, &err), err);
    TEST_CHECK(m.n == zs_gpt_num_tensors(&k_cfg));
    uint64_t covered = 0;
    for (int i = 0; i < m.n; i++) {
        zs_gpt_tensor_t t;
        TEST_OK(zs_gpt_tensor(&k_cfg, i, &t), err);
        TEST_CHECKF(m.t[i].offset == t.offset && m.t[i].numel == t.numel &&
                        m.t[i].shape[0] == (t.rows == 1 ? t.cols : t.rows),
                    "tensor %d (%s): offset %llu numel %llu vs %s %llu %llu", i, m.t[i].name,
                    (unsigned long long)m.t[i].offset, (unsigned long long)m.t[i].numel, t.name,
                    (unsigned long long)t.offset, (unsigned long long)t.numel);
        covered += t.numel;
    }
    TEST_CHECK(covered == P);
    TEST_CHECK(!strcmp(m.t[0].name, "transformer.wte.weight"));
    TEST_CHECK(!strcmp(m.t[4].name, "transformer.h.0.attn.c_attn.weight") && m.t[4].ndim == 2 &&
               m.t[4].shape[1] == 3 * (uint64_t)k_cfg.width);
    zs_ctl_manifest_free(&m);
    printf("0. GPT manifest: %d tensors, %zu bytes, offsets/shapes = zs_gpt_tensor\n",
           zs_gpt_num_tensors(&k_cfg), strlen(man));
    free(man);
    /* GPT-2 XL's manifest (48 layers, 580 tensors) fits a checkpoint beside
     * the engine's 60 bytes of state */
    const zs_gpt_config_t xl = {48, 25, 1600, 1024, 50257};
    TEST_OK(zs_gpt_manifest(&xl, "gpt2-xl", &man, &err), err);
    TEST_CHECKF(strlen(man) + 64 <= ZS_CLIENT_USER_META_MAX, "GPT-2 XL manifest: %zu bytes",
                strlen(man));
    printf("0. GPT-2 XL manifest: %d tensors, %zu bytes (user_meta limit %u)\n",
           zs_gpt_num_tensors(&xl), strlen(man), ZS_CLIENT_USER_META_MAX);
    free(man);

    /* Each must be refused (P = 100). */
    static const char *const bad[] = {
        "not json",
        "{\"format\":\"other/1\",\"model\":{},\"storage_dtype\":\"F32\",\"num_params\":100,"
        "\"tensors\":[[\"a\",[100],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"BF16\","
        "\"num_params\":100,\"tensors\":[[\"a\",[100],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":99,\"tensors\":[[\"a\",[100],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a b\",[10],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\\\"\",[10],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10],0],[\"a\",[10],10]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10],0],[\"b\",[10],9]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10],95]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[2.5,4],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[0],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[1,1,1,1,1,1,1,1,1],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10],-1]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10,10000000000],0]]}",
        "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":\"F32\","
        "\"num_params\":100,\"tensors\":[[\"a\",[10]]]}",
    };
    const char *good = "{\"format\":\"zeroshard-manifest/1\",\"model\":{},\"storage_dtype\":"
                       "\"F32\",\"num_params\":100,\"tensors\":[[\"b\",[10,9],10],[\"a\",[10],0]]}";
    TEST_OK(zs_ctl_manifest_parse(good, strlen(good), 100, &m, &err), err);
    TEST_CHECK(m.n == 2 && m.t[0].offset == 0 && m.t[1].numel == 90); /* sorted by offset */
    zs_ctl_manifest_free(&m);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = zs_ctl_manifest_parse(bad[i], strlen(bad[i]), 100, &m, &err);
        TEST_CHECKF(rc == ZS_ERR_CORRUPT, "bad manifest %zu accepted (rc %d): %s", i, rc, bad[i]);
    }
    printf("0. %zu malformed manifests refused, e.g. '%s'\n", sizeof bad / sizeof bad[0], err.msg);

    /* The engine's state: parsed with and without a manifest; refused when
     * truncated, extended, of another magic or with a wrong length field. */
    uint8_t *meta;
    size_t len = engine_meta(7, 5, "{\"x\":1}", &meta);
    zs_engine_ckpt_meta_t em;
    TEST_OK(zs_engine_meta_parse(meta, len, &em, &err), err);
    TEST_CHECK(em.step == 7 && em.adam_t == 5 && em.manifest_len == 7 &&
               !memcmp(em.manifest, "{\"x\":1}", 7));
    TEST_OK(zs_engine_meta_parse(meta, len - 11, &em, &err), err); /* an old one: no manifest */
    TEST_CHECK(em.manifest == NULL && em.manifest_len == 0);
    const size_t bad_len[] = {0, 3, len - 12, len - 10, len - 1, len + 1};
    uint8_t *big = calloc(1, len + 1);
    memcpy(big, meta, len);
    for (size_t i = 0; i < sizeof bad_len / sizeof bad_len[0]; i++)
        TEST_CHECKF(zs_engine_meta_parse(big, bad_len[i], &em, &err) == ZS_ERR_CORRUPT,
                    "engine state of %zu bytes accepted", bad_len[i]);
    big[0] ^= 1;
    TEST_CHECK(zs_engine_meta_parse(big, len, &em, &err) == ZS_ERR_CORRUPT);
    printf("0. engine state: parsed with and without a manifest; 7 malformed refused\n");
    free(big);
    free(meta);
}

/* ---- CPU model logits on fixed tokens ------------------------------------ */

static void cpu_logits(const float *w, const int32_t *in, const int32_t *tg, int B, float *out)
{
    zs_err_t err;
    zs_dev_t *dev;
    zs_stream_t *st;
    zs_gpt_t *g;
    TEST_OK(zs_dev_cpu_create(2, &dev, &err), err);
    TEST_OK(zs_dev_stream_create(dev, 0, "compute", &st, &err), err);
    TEST_OK(zs_gpt_create(&k_cfg, B, 1, &g, &err), err);
    TEST_OK(zs_gpt_set_threads(g, 2, &err), err);
    const zs_model_t *m = zs_gpt_model(g);
    TEST_OK(m->bind(m->self, dev, st, &err), err);
    uint64_t P = zs_gpt_num_params(&k_cfg);
    void *dw;
    TEST_OK(zs_dev_alloc(dev, ZS_SPACE_DEVICE, ZS_MEM_PARAMS, P * 4, &dw, &err), err);
    TEST_OK(zs_dev_memcpy(st, dw, w, P * 4, &err), err);
    TEST_OK(zs_dev_stream_sync(st, &err), err);
    TEST_OK(zs_gpt_set_tokens(g, in, tg, B, k_cfg.ctx, &err), err);
    uint64_t off = 0;
    for (int i = 0; i < m->nlayers; i++) {
        void *p[2] = {(float *)dw + off, dw};
        TEST_OK(m->forward(m->self, i, p, &err), err);
        off += m->nparams[i];
    }
    double loss;
    TEST_OK(m->loss(m->self, &loss, &err), err);
    TEST_OK(zs_gpt_copy_logits(g, out, &err), err);
    printf("2. C model on the saved weights: loss %.5f on the fixed tokens\n", loss);
    zs_gpt_destroy(g);
    zs_dev_free(dev, dw);
    zs_dev_stream_destroy(st);
    zs_dev_destroy(dev);
}

/* ---- 1-2. train, export, check ------------------------------------------- */

static void test_export(const char *A, const char *saved)
{
    uint64_t P = zs_gpt_num_params(&k_cfg);
    char d[300];
    snprintf(d, sizeof d, "%s/x", g_tmp);
    TEST_CHECK(zs_test_sh("mkdir -p %s", d) == 0);
    ctl_ok("export fp32", ctl("export --servers %s --out %s/f32.safetensors", A, d));
    TEST_CHECK(ctl_said("28 tensors"));
    ctl_ok("export bf16", ctl("--servers %s export --out %s/bf16.safetensors --dtype bf16", A, d));
    ctl_ok("export fp16",
           ctl("export --servers %s --step 6 --dtype fp16 --out %s/f16.safetensors", A, d));
    ctl_ok("export --optimizer",
           ctl("export --servers %s --out %s/opt.safetensors --optimizer", A, d));
    /* the reader's inputs: config and fixed tokens */
    const int B = 2, T = k_cfg.ctx, V = k_cfg.vocab;
    int32_t tok[2 * 2 * 32];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % V);
        tok[B * T + i] = (int32_t)((i * 13 + 5 + i / 3) % V);
    }
    char path[400], line[128];
    snprintf(line, sizeof line, "%d %d %d %d %d %d %d\n", k_cfg.layers, k_cfg.heads, k_cfg.width,
             k_cfg.ctx, V, B, T);
    snprintf(path, sizeof path, "%s/config.txt", d);
    write_file(path, line, strlen(line));
    snprintf(path, sizeof path, "%s/tokens.bin", d);
    write_file(path, tok, sizeof tok);
    int rc = zs_test_sh("%s %s/tests/ref/export_check.py gpt %s", ZS_PYTHON, ZS_SOURCE_DIR, d);
    TEST_CHECKF(rc == 0, "export_check.py gpt exited %d", rc);

    /* the reader's flat weights = what zs-train saved, bitwise */
    float *w = read_floats(saved, P);
    snprintf(path, sizeof path, "%s/flat.bin", d);
    float *flat = read_floats(path, P);
    TEST_CHECKF(!memcmp(w, flat, P * 4), "exported fp32 weights differ from --save-params");
    printf("2. fp32 export = zs-train --save-params, bitwise (%llu parameters)\n",
           (unsigned long long)P);
    /* moments = the servers' GetState, bitwise */
    zs_client_t *c = client(A);
    zs_err_t err;
    float *mom = malloc(P * 4);
    for (int x = 1; x <= 2; x++) {
        TEST_OK(zs_client_get_state(c, x, 0, P, mom, &err), err);
        snprintf(path, sizeof path, "%s/%s.bin", d, x == 1 ? "exp_avg" : "exp_avg_sq");
        float *got = read_floats(path, P);
        TEST_CHECKF(!memcmp(got, mom, P * 4), "exported %s differs from the servers'", path);
        free(got);
    }
    printf("2. --optimizer: exp_avg, exp_avg_sq = the servers' state, bitwise\n");
    free(mom);
    zs_client_destroy(c);

    /* logits: torch on the export vs the C model on the saved weights */
    size_t nl = (size_t)B * T * V;
    float *cl = malloc(nl * 4);
    cpu_logits(w, tok, tok + B * T, B, cl);
    snprintf(path, sizeof path, "%s/logits.bin", d);
    float *tl = read_floats(path, nl);
    double maxe = 0;
    for (size_t i = 0; i < nl; i++)
        TEST_CHECKF(zs_test_close(tl[i], cl[i], 2e-5, 1e-4, &maxe), "logit %zu: torch %.8g, C %.8g",
                    i, tl[i], cl[i]);
    printf("2. logits of torch's GPT on the export vs the C model: max |diff| %.3g over %zu "
           "(atol 2e-5 + rtol 1e-4)\n",
           maxe, nl);
    free(cl);
    free(tl);
    free(w);
    free(flat);
}

/* ---- 3. reshard 2 -> 3 -> 1, resume, compare ----------------------------- */

static void test_reshard(const char *A)
{
    zs_test_server_t Bs[3], Cs[1], Ds[1];
    char B[256], C[256], D[256];
    start_servers(Bs, 3, "b", B, sizeof B);
    start_servers(Cs, 1, "c", C, sizeof C);
    start_servers(Ds, 1, "d", D, sizeof D);
    zs_err_t err;

    int rc = ctl("reshard --from %s --to %s", A, A);
    TEST_CHECKF(rc == 1 && ctl_said("is a source and a target"), "target = source: rc %d", rc);
    ctl_ok("reshard 2 -> 3", ctl("reshard --from %s --to %s", A, B));
    TEST_CHECK(ctl_said("moved from 2 to 3 servers and verified"));
    zs_test_sh("grep '^reshard' %s/ctl.log | sed 's/^/   /'", g_tmp);
    ctl_ok("reshard 3 -> 1", ctl("reshard --from %s --to %s", B, C));
    zs_test_sh("grep '^reshard' %s/ctl.log | sed 's/^/   /'", g_tmp);
    /* a chunk corrupted on the way: the end-to-end check fails, and the
     * target keeps no checkpoint anyone could resume from */
    rc = zs_test_sh("ZS_CTL_DEBUG_CORRUPT=1 ZS_LOG_LEVEL=warn %s reshard --from %s --to %s > "
                    "%s/ctl.log 2>&1",
                    CTL, B, D, g_tmp);
    TEST_CHECKF(rc == 1 && ctl_said("checksum mismatch"), "corrupted reshard: rc %d", rc);
    zs_client_t *dc = client(D);
    uint64_t steps[4];
    size_t n;
    TEST_OK(zs_client_checkpoints(dc, steps, 4, &n, &err), err);
    TEST_CHECKF(n == 0, "the unverified target kept %zu checkpoints", n);
    zs_client_destroy(dc);
    printf("3. reshard: target = source refused; a corrupted chunk fails the checksum and "
           "the target keeps no checkpoint\n");

    /* the source is untouched: same export as before */
    ctl_ok("export after reshard",
           ctl("export --servers %s --out %s/x/again.safetensors", A, g_tmp));
    TEST_CHECK(zs_test_sh("cmp -s %s/x/f32.safetensors %s/x/again.safetensors", g_tmp, g_tmp) == 0);

    /* resume on 1 server (moved twice) and on the original 2 */
    char args[600];
    snprintf(args, sizeof args, "--resume --steps 10 --log-every 10 --save-params %s/pC.bin",
             g_tmp);
    train(2, C, args);
    snprintf(args, sizeof args, "--resume --steps 10 --log-every 10 --save-params %s/pA.bin",
             g_tmp);
    train(2, A, args);
    uint64_t P = zs_gpt_num_params(&k_cfg);
    char pa[300], pc[300];
    snprintf(pa, sizeof pa, "%s/pA.bin", g_tmp);
    snprintf(pc, sizeof pc, "%s/pC.bin", g_tmp);
    float *a = read_floats(pa, P), *c = read_floats(pc, P);
    uint64_t diff = 0;
    for (uint64_t i = 0; i < P; i++)
        diff += memcmp(&a[i], &c[i], 4) != 0;
    TEST_CHECKF(diff == 0, "%llu of %llu parameters differ after resuming on the moved checkpoint",
                (unsigned long long)diff, (unsigned long long)P);
    printf("3. 2 -> 3 -> 1 servers, resumed to step 10: bitwise equal to never moving "
           "(%llu parameters)\n",
           (unsigned long long)P);
    free(a);
    free(c);
    /* A now holds step 10 without a checkpoint: export refuses, --restore too */
    rc = ctl("export --servers %s --out %s/x/no.safetensors", A, g_tmp);
    TEST_CHECKF(rc == 1 && ctl_said("hold step 10, not checkpoint 6"), "export of moved: %d", rc);
    rc = ctl("export --servers %s --out %s/x/no.safetensors --restore", A, g_tmp);
    TEST_CHECKF(rc == 1 && ctl_said("not a complete checkpoint"), "--restore: %d", rc);
    char no[300];
    snprintf(no, sizeof no, "%s/x/no.safetensors", g_tmp);
    TEST_CHECK(access(no, F_OK) != 0);
    printf("3. export refuses servers that moved past the checkpoint (and --restore would lose "
           "their step)\n");
    zs_test_servers_down(Bs, 3);
    zs_test_servers_down(Cs, 1);
    zs_test_servers_down(Ds, 1);
}

/* ---- 4. peak memory on a model 100x the chunk ---------------------------- */

/* zs-ctl with these arguments (NULL-terminated), output to DIR/ctl.log;
 * must succeed. Returns its peak RSS in MiB as it reports it ("peak memory
 * X MiB": VmHWM of its own address space; wait4's ru_maxrss would also
 * count this test's pages, copied by fork, up to the exec). */
static double ctl_rss(const char *a0, ...)
{
    const char *argv[16] = {CTL, a0};
    int n = 2;
    va_list ap;
    va_start(ap, a0);
    while (n < 15 && (argv[n] = va_arg(ap, const char *)) != NULL)
        n++;
    va_end(ap);
    argv[n] = NULL;
    char log[300];
    snprintf(log, sizeof log, "%s/ctl.log", g_tmp);
    pid_t pid = fork();
    TEST_CHECK(pid >= 0);
    if (pid == 0) { /* exec at once: gRPC state does not survive fork */
        if (!freopen(log, "w", stdout))
            _exit(126);
        dup2(1, 2);
        execv(CTL, (char *const *)argv);
        _exit(127);
    }
    int st;
    TEST_CHECK(waitpid(pid, &st, 0) == pid);
    ctl_ok(a0, WIFEXITED(st) ? WEXITSTATUS(st) : 128);
    FILE *f = fopen(log, "r");
    char line[512];
    double mib = -1;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "peak memory ");
        if (p)
            sscanf(p, "peak memory %lf MiB", &mib);
    }
    if (f)
        fclose(f);
    TEST_CHECKF(mib > 0, "zs-ctl %s printed no peak memory (see %s)", a0, log);
    return mib;
}

static float synth(uint64_t i) /* exact in fp32; export_check.py synth knows it */
{
    return (float)((uint32_t)(i * 2654435761u) % 65536u) / 65536.0f - 0.5f;
}

static void test_memory(void)
{
    const zs_gpt_config_t big = {4, 10, 640, 128, 8192};
    uint64_t P = zs_gpt_num_params(&big);
    zs_test_server_t Es[2];
    char E[256];
    start_servers(Es, 2, "e", E, sizeof E); /* --keep 4: checkpoint 3 stays (below) */
    zs_err_t err;
    zs_client_opts_t o = {E, NULL, NULL, 120000, 2};
    zs_client_t *c;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    float *w = malloc(P * 4);
    TEST_CHECK(w);
    for (uint64_t i = 0; i < P; i++)
        w[i] = synth(i);
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1};
    TEST_OK(zs_client_init(c, "big", P, &hp, w, 3, 1, &err), err);
    free(w);
    TEST_OK(zs_client_set_step(c, 3, 3, &err), err);
    char *man;
    TEST_OK(zs_gpt_manifest(&big, "big", &man, &err), err);
    uint8_t *meta;
    size_t len = engine_meta(3, 3, man, &meta);
    TEST_OK(zs_client_checkpoint_meta(c, 3, 0, meta, len, &err), err);
    free(meta);

    char out[300];
    snprintf(out, sizeof out, "%s/big.safetensors", g_tmp);
    double model = (double)P * 4 / (1 << 20);
    double rss = ctl_rss("export", "--servers", E, "--out", out);
    printf("4. export of a %llu-parameter model (%.0f MiB fp32, %.0fx the %u KiB chunk): "
           "exporter peak RSS %.1f MiB\n",
           (unsigned long long)P, model, model * 1024 / (ZS_CTL_CHUNK * 4 / 1024),
           ZS_CTL_CHUNK * 4 / 1024, rss);
    TEST_CHECKF(rss < model / 2, "peak RSS %.1f MiB is not O(chunk) (model %.0f MiB)", rss, model);
    zs_test_sh("grep '^export: [0-9.]* s' %s/ctl.log | sed 's/^/   /'", g_tmp);
    int rc = zs_test_sh("%s %s/tests/ref/export_check.py synth %s %llu", ZS_PYTHON, ZS_SOURCE_DIR,
                        out, (unsigned long long)P);
    TEST_CHECKF(rc == 0, "export_check.py synth exited %d", rc);
    unlink(out);

    /* reshard it 2 -> 1 (three tensors: 3x the model moved) and export the
     * target: the same values */
    zs_test_server_t Fs[1];
    char F[256];
    start_servers(Fs, 1, "f", F, sizeof F);
    rss = ctl_rss("reshard", "--from", E, "--to", F);
    TEST_CHECK(ctl_said("moved from 2 to 1 servers and verified"));
    printf("4. reshard of it, 2 -> 1 servers (%.0f MiB of master + moments): peak RSS %.1f "
           "MiB\n",
           3 * model, rss);
    TEST_CHECKF(rss < model / 2, "reshard peak RSS %.1f MiB is not O(chunk)", rss);
    zs_test_sh("grep '^reshard: [0-9.]* s' %s/ctl.log | sed 's/^/   /'", g_tmp);
    ctl_ok("export (big, resharded)", ctl("export --servers %s --out %s", F, out));
    rc = zs_test_sh("%s %s/tests/ref/export_check.py synth %s %llu", ZS_PYTHON, ZS_SOURCE_DIR, out,
                    (unsigned long long)P);
    TEST_CHECKF(rc == 0, "export_check.py synth (resharded) exited %d", rc);
    unlink(out);
    zs_test_servers_down(Fs, 1);

    /* a checkpoint without a manifest, and one of foreign client state */
    TEST_OK(zs_client_set_step(c, 4, 4, &err), err);
    len = engine_meta(4, 4, NULL, &meta);
    TEST_OK(zs_client_checkpoint_meta(c, 4, 0, meta, len, &err), err);
    free(meta);
    rc = ctl("export --servers %s --out %s", E, out);
    TEST_CHECKF(rc == 1 && ctl_said("carries no model manifest"), "no manifest: rc %d", rc);
    TEST_OK(zs_client_set_step(c, 5, 5, &err), err);
    TEST_OK(zs_client_checkpoint_meta(c, 5, 0, "hello", 5, &err), err);
    rc = ctl("export --servers %s --out %s", E, out);
    TEST_CHECKF(rc == 1 && ctl_said("not written by the zeroshard engine"), "foreign: rc %d", rc);
    TEST_CHECK(access(out, F_OK) != 0 && zs_test_sh("ls %s.part 2>/dev/null", out) != 0);
    printf("4. checkpoints without a manifest or with foreign client state: refused, no file\n");

    /* user_meta up to the limit goes through Checkpoint, GetCheckpointMeta
     * and Restore (unary messages); one byte more is refused */
    uint8_t *um = malloc(ZS_CLIENT_USER_META_MAX + 1), *back = malloc(ZS_CLIENT_USER_META_MAX);
    for (size_t i = 0; i <= ZS_CLIENT_USER_META_MAX; i++)
        um[i] = (uint8_t)(i * 7 + 1);
    TEST_OK(zs_client_set_step(c, 6, 6, &err), err);
    rc = zs_client_checkpoint_meta(c, 6, 0, um, ZS_CLIENT_USER_META_MAX + 1, &err);
    TEST_CHECKF(rc == ZS_ERR_INVALID, "user_meta above the limit: rc %d (%s)", rc, err.msg);
    TEST_OK(zs_client_checkpoint_meta(c, 6, 0, um, ZS_CLIENT_USER_META_MAX, &err), err);
    size_t blen = 0;
    TEST_OK(zs_client_checkpoint_info(c, 6, NULL, back, ZS_CLIENT_USER_META_MAX, &blen, &err), err);
    TEST_CHECK(blen == ZS_CLIENT_USER_META_MAX && !memcmp(back, um, blen));
    memset(back, 0, ZS_CLIENT_USER_META_MAX);
    TEST_OK(zs_client_restore_meta(c, 6, back, ZS_CLIENT_USER_META_MAX, &blen, &err), err);
    TEST_CHECK(blen == ZS_CLIENT_USER_META_MAX && !memcmp(back, um, blen));
    rc = zs_client_checkpoint_info(c, 99, NULL, NULL, 0, NULL, &err);
    TEST_CHECKF(rc == ZS_ERR_NOTFOUND, "GetCheckpointMeta of a missing step: rc %d", rc);
    free(um);
    free(back);
    printf("4. user_meta of %u bytes through Checkpoint, GetCheckpointMeta, Restore; one more "
           "refused; a missing checkpoint's metadata: NOT_FOUND\n",
           ZS_CLIENT_USER_META_MAX);
    rc = ctl("export --servers %s --out %s", E, out);
    TEST_CHECKF(rc == 1 && ctl_said("not written by the zeroshard engine"), "step 6: rc %d", rc);

    /* checkpoint 3 while the servers hold 6: only with --restore, which
     * restores 3, exports it and restores 6 back */
    rc = ctl("export --servers %s --step 3 --out %s", E, out);
    TEST_CHECKF(rc == 1 && ctl_said("hold checkpoint 6, not 3: pass --step 6"), "--step 3: rc %d",
                rc);
    ctl_ok("export --step 3 --restore", ctl("export --servers %s --step 3 --restore --out %s "
                                            "--dtype bf16",
                                            E, out));
    zs_server_info_t in[2];
    TEST_OK(zs_client_hello(c, "", 0, in, &err), err);
    TEST_CHECKF(in[0].applied_step == 6 && in[1].applied_step == 6,
                "after --restore the servers hold %llu/%llu, not 6 again",
                (unsigned long long)in[0].applied_step, (unsigned long long)in[1].applied_step);
    FILE *f = fopen(out, "rb");
    TEST_CHECK(f && fseek(f, 0, SEEK_END) == 0);
    long size = ftell(f);
    fclose(f);
    TEST_CHECKF(size > (long)(P * 2) && size < (long)(P * 2) + (1 << 20),
                "bf16 export of %llu parameters has %ld bytes", (unsigned long long)P, size);
    printf("4. --step 3 refused while the servers hold 6; with --restore exported (bf16, %.1f "
           "MB) and the servers hold 6 again\n",
           size / 1e6);
    unlink(out);
    free(man);
    zs_client_destroy(c);
    zs_test_servers_down(Es, 2);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("export"));
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    test_unit();

    zs_test_tokenize(ZS_TOKENIZE, g_data,
                     "/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0");
    zs_test_server_t As[2];
    char A[256], args[600], saved[300];
    start_servers(As, 2, "a", A, sizeof A);
    snprintf(saved, sizeof saved, "%s/p6.bin", g_tmp);
    snprintf(args, sizeof args, "--steps 6 --ckpt-every 6 --log-every 6 --save-params %s", saved);
    train(2, A, args);
    printf("1. zs-train: 2 workers, 2 servers, 6 steps, checkpoint 6\n");

    test_export(A, saved);
    test_reshard(A);
    test_memory();
    zs_test_servers_down(As, 2);
    printf("PASS test_export\n");
    return 0;
}
