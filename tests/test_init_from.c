/*
 * test_init_from.c - zs-train --init-from (worker/model/zs_init_from*.c)
 * against PyTorch, with an independent writer of the weight files
 * (tests/ref/init_from_ref.py: hand-written safetensors and llm.c
 * checkpoint, loss by tests/ref/gpt_torch.py).
 *
 * A random GPT-2-shaped model (2 layers, 4 heads, width 32, 16 positions,
 * vocab 300) and one sequence of T + 1 tokens (so every sample window is
 * the whole file and the step-1 loss is the loss of that sequence):
 *  1. zs-train --init-from on each of the three files (our export's
 *     layout; GPT2Model's own names with mask buffers and a tied lm_head;
 *     an llm.c checkpoint with padded vocab and [out, in] matrices, in fp32
 *     and in bf16 (version 5; PyTorch then on bf16-rounded weights), W = 2:
 *     the loss of step 1 (computed on the initial weights) equals
 *     PyTorch's within 2e-5 (the CSV keeps 6 decimals).
 *  2. With 2 zs-servers: 3 steps from the export-layout file, checkpoint 3
 *     (--save-params), `zs-ctl export`; the exported file read back by
 *     zs_init_from gives the step-3 weights bitwise and its metadata the
 *     heads; PyTorch loads it (by hand) and its loss equals the step-4
 *     loss of zs-train --resume from checkpoint 3 (computed on the step-3
 *     weights).
 *     The same resumed run evaluates --val-data (5 windows of T + 1, shared
 *     3 + 2 by the ranks) after step 4; checkpoint 4 is exported and
 *     PyTorch's mean loss on those windows equals the CSV's val_loss and
 *     the log's "val loss" line; the run's greedy sample (--sample-every
 *     --temperature 0) equals zs-generate's and PyTorch's greedy decode on
 *     that export; zs-generate's sampling repeats with its seed, changes
 *     with another, and is greedy at top-k 1. zs-generate --temperature 0
 *     on the step-3 export and on the llm.c checkpoint gives PyTorch's
 *     greedy decode.
 *  3. Refusals: --layers and --width that disagree (exit 2, naming both),
 *     data of another vocab (exit 2), a truncated llm.c checkpoint and a
 *     safetensors file without ln_f (exit 4), --init-from with --resume.
 *  0. First, without torch: zs_init_from_load on crafted files: a good
 *     safetensors and llm.c file (v3, v5) load, with their shape; refused,
 *     naming the file: a header longer than the file, JSON that does not
 *     parse, dtype I32, data offsets beyond the data, a shape that does not
 *     fit, one tensor under two names, a missing tensor, llm.c version 4, an
 *     llm.c header whose heads do not divide the width, a missing file.
 * The rest is skipped (77) when python3 cannot import torch.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_data.h"
#include "zs_init_from.h"
#include "zs_proc.h"
#include "zs_test.h"

#define L  2
#define NH 4
#define C  32
#define T  16
#define V  300

static char dir[256], g_servers[256];

static const char *tpath(const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static double read_double(const char *path)
{
    FILE *f = fopen(path, "r");
    double v = NAN;
    TEST_CHECKF(f && fscanf(f, "%lf", &v) == 1, "cannot read a number from %s", path);
    fclose(f);
    return v;
}

/* mpirun -np 2 zs-train --init-from ... ARGS; returns the exit code. */
static int train(const char *init, const char *data, const char *args, const char *log)
{
    return zs_test_sh("ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS " -np 2 %s --data %s --init-from %s "
                      "%s > %s 2>&1",
                      ZS_MPIEXEC, ZS_TRAIN, data, init, args, log);
}

static void expect_refusal(const char *init, const char *data, const char *args, int code,
                           const char *what)
{
    int rc = train(init, data, args, tpath("refuse.log"));
    TEST_CHECKF(rc == code && zs_test_sh("grep -qF -- '%s' %s", what, tpath("refuse.log")) == 0,
                "--init-from %s %s: exit %d (want %d, saying \"%s\")", init, args, rc, code, what);
    zs_test_sh("grep 'error' %s | head -1 | sed 's/^/   refused: /'", tpath("refuse.log"));
}

static void check_step1(const char *file, double want, const char *extra)
{
    char args[900];
    snprintf(args, sizeof args, "--heads %d --steps 1 --csv %s %s", NH, tpath("s1.csv"), extra);
    int rc = train(tpath(file), tpath("data.tok"), args, tpath("s1.log"));
    if (rc)
        zs_test_sh("cat %s >&2", tpath("s1.log"));
    TEST_CHECKF(rc == 0, "zs-train --init-from %s exited %d", file, rc);
    double got = zs_test_csv_loss(tpath("s1.csv"), 1);
    printf("1. --init-from %-18s %s step-1 loss %.6f, PyTorch %.6f (diff %.2g)\n", file, extra, got,
           want, fabs(got - want));
    TEST_CHECKF(fabs(got - want) <= 2e-5, "%s: loss %.6f differs from PyTorch's %.6f", file, got,
                want);
}

/* The exported file through zs_init_from: shape, heads, and the weights
 * bitwise equal to the --save-params file. */
static void check_export_bitwise(const char *exported, const char *params)
{
    zs_err_t err;
    zs_init_from_t *f;
    TEST_OK(zs_init_from_load(exported, &f, &err), err);
    zs_gpt_config_t s = zs_init_from_shape(f), c = {4, 4, 128, 64, 256};
    TEST_CHECKF(s.layers == L && s.heads == NH && s.width == C && s.ctx == T && s.vocab == V,
                "exported shape L=%d H=%d C=%d T=%d V=%d", s.layers, s.heads, s.width, s.ctx,
                s.vocab);
    TEST_OK(zs_init_from_settle(f, &c, 0, 0, 0, 0, V, &err), err);
    uint64_t P = zs_gpt_num_params(&c);
    float *flat = malloc(P * sizeof *flat), *want = malloc(P * sizeof *want);
    for (int i = 0; i < zs_gpt_num_tensors(&c); i++) {
        zs_gpt_tensor_t t;
        zs_gpt_tensor(&c, i, &t);
        TEST_OK(zs_init_from_tensor(f, &c, i, flat + t.offset, &err), err);
    }
    FILE *pf = fopen(params, "rb");
    TEST_CHECK(pf && fread(want, sizeof *want, P, pf) == P);
    fclose(pf);
    TEST_CHECKF(memcmp(flat, want, P * sizeof *flat) == 0,
                "exported weights read by --init-from differ from the servers' step-3 weights");
    printf("2. export -> init-from: %llu parameters bitwise equal to step 3's, heads %d from "
           "the export's metadata\n",
           (unsigned long long)P, s.heads);
    free(flat);
    free(want);
    zs_init_from_free(f);
}

/* The val_loss column of step 4 (the CSV's 13th) and the log line against
 * PyTorch on the exported step-4 weights over the same 5 windows. */
static void check_val(const char *csv_path, const char *log_path)
{
    char csv[512], log[512]; /* tpath's buffers are reused below */
    snprintf(csv, sizeof csv, "%s", csv_path);
    snprintf(log, sizeof log, "%s", log_path);
    TEST_CHECKF(zs_test_sh("ZS_LOG_LEVEL=warn %s export --servers %s --out %s > %s 2>&1", ZS_CTL,
                           g_servers, tpath("out4.safetensors"), tpath("ctl.log")) == 0,
                "zs-ctl export of step 4 failed (%s)", tpath("ctl.log"));
    TEST_CHECK(zs_test_sh("%s %s/tests/ref/init_from_ref.py loss %s %s %d %d %d %d %d %s > %s",
                          ZS_PYTHON, ZS_SOURCE_DIR, tpath("out4.safetensors"), dir, L, NH, C, T, V,
                          tpath("val.bin"), tpath("val.txt")) == 0);
    double want = read_double(tpath("val.txt"));
    TEST_CHECK(zs_test_sh("grep '^4,' %s | cut -d, -f13 > %s", csv, tpath("val_csv.txt")) == 0);
    double got = read_double(tpath("val_csv.txt"));
    printf("4. validation loss after step 4 (5 windows, W=2): zs-train %.6f, PyTorch on the "
           "export %.6f (diff %.2g)\n",
           got, want, fabs(got - want));
    TEST_CHECKF(fabs(got - want) <= 2e-5, "validation loss %.6f differs from PyTorch's %.6f", got,
                want);
    TEST_CHECKF(zs_test_sh("grep -q '^val loss %.4f at step 4 (81 tokens)' %s", got, log) == 0,
                "the log lacks the validation line (%s)", log);
    /* the trainer's greedy sample after step 4 (default prompt: id 0, ids
     * printed for vocab 300) == zs-generate and PyTorch on the export */
    TEST_CHECK(zs_test_sh("grep -A2 '^sample at step 4 (8 tokens after a 1-token prompt):' %s | "
                          "tail -1 > %s",
                          log, tpath("sample.txt")) == 0);
    TEST_CHECK(zs_test_sh("%s --model %s --ids --temperature 0 --prompt-ids 0 --tokens 8 > %s",
                          ZS_GENERATE, tpath("out4.safetensors"), tpath("gen4.txt")) == 0);
    TEST_CHECK(zs_test_sh("%s %s/tests/ref/init_from_ref.py greedy %s %d %d %d %d %d 8 0 > %s",
                          ZS_PYTHON, ZS_SOURCE_DIR, tpath("out4.safetensors"), L, NH, C, T, V,
                          tpath("torch4.txt")) == 0);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s && cmp -s %s %s", tpath("sample.txt"), tpath("gen4.txt"),
                           tpath("gen4.txt"), tpath("torch4.txt")) == 0,
                "--sample-every's greedy sample, zs-generate and PyTorch differ (%s)", log);
    zs_test_sh("sed 's/^/   /' %s", tpath("sample.txt"));
    printf("4. --sample-every 4 --temperature 0 == zs-generate == PyTorch greedy on the export\n");
    /* sampling: seeded (same seed, same text), top-k 1 is greedy */
    TEST_CHECK(zs_test_sh("for s in 1 1 2; do %s --model %s --ids --prompt-ids 0 --tokens 12 "
                          "--seed $s --temperature 2 --top-k 50; done > %s",
                          ZS_GENERATE, tpath("out4.safetensors"), tpath("seeds.txt")) == 0);
    TEST_CHECK(zs_test_sh("%s --model %s --ids --prompt-ids 0 --tokens 8 --top-k 1 --seed 5 > %s",
                          ZS_GENERATE, tpath("out4.safetensors"), tpath("k1.txt")) == 0);
    TEST_CHECKF(zs_test_sh("test \"$(sed -n 1p %s)\" = \"$(sed -n 2p %s)\" && "
                           "test \"$(sed -n 1p %s)\" != \"$(sed -n 3p %s)\" && cmp -s %s %s",
                           tpath("seeds.txt"), tpath("seeds.txt"), tpath("seeds.txt"),
                           tpath("seeds.txt"), tpath("k1.txt"), tpath("gen4.txt")) == 0,
                "sampling: the same seed must repeat, another seed differ, top-k 1 be greedy");
    printf("4. zs-generate sampling: seeded, top-k 1 == greedy\n");
}

/* zs-generate --temperature 0 on file (the llm.c checkpoint: on the same
 * weights as export.safetensors) against PyTorch's greedy decode. */
static void check_generate(const char *file_path)
{
    char file[512], torch_file[512];
    snprintf(file, sizeof file, "%s", file_path);
    snprintf(torch_file, sizeof torch_file, "%s",
             strstr(file, "llmc") ? tpath("export.safetensors") : file);
    TEST_CHECK(zs_test_sh("%s --model %s --heads %d --ids --temperature 0 --prompt-ids 5,17,3 "
                          "--tokens 12 > %s 2>&1",
                          ZS_GENERATE, file, NH, tpath("gen.txt")) == 0);
    TEST_CHECK(zs_test_sh("%s %s/tests/ref/init_from_ref.py greedy %s %d %d %d %d %d 12 5,17,3 > "
                          "%s",
                          ZS_PYTHON, ZS_SOURCE_DIR, torch_file, L, NH, C, T, V,
                          tpath("gen_torch.txt")) == 0);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", tpath("gen.txt"), tpath("gen_torch.txt")) == 0,
                "zs-generate on %s differs from PyTorch's greedy decode", file);
    zs_test_sh("sed 's/^/   /' %s", tpath("gen.txt"));
    printf("2. zs-generate --temperature 0 on %s == PyTorch's greedy decode (15 ids)\n",
           strrchr(file, '/') + 1);
}

/* ---- the reader's refusals on crafted files (no torch needed) ---------- */

enum { ST_OK, ST_BIG_HEADER, ST_JSON, ST_I32, ST_OFFSETS, ST_SHAPE, ST_DUP, ST_MISSING };

/* A safetensors file of a 1-layer GPT (C 4, T 2, V 3, F32 zeros), spoiled
 * as `how` says. */
static void st_write(const char *path, int how)
{
    static const char *const blk[12] = {
        "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
        "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    const int r[12] = {0, 0, 4, 0, 4, 0, 0, 0, 4, 0, 16, 0}; /* rows (0: 1-D) */
    const int c[12] = {4, 4, 12, 12, 4, 4, 4, 4, 16, 16, 4, 4};
    char h[4096];
    size_t n = 0, off = 0;
    n += (size_t)snprintf(h + n, sizeof h - n, "{\"__metadata__\":{\"format\":\"pt\"}");
#define T1(name, dt, rows, cols)                                                                   \
    do {                                                                                           \
        size_t bytes = (size_t)((rows) ? (rows) : 1) * (cols)*4;                                   \
        if ((rows))                                                                                \
            n += (size_t)snprintf(h + n, sizeof h - n,                                             \
                                  ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],"                   \
                                  "\"data_offsets\":[%zu,%zu]}",                                   \
                                  name, dt, rows, cols, off, off + bytes);                         \
        else                                                                                       \
            n += (size_t)snprintf(h + n, sizeof h - n,                                             \
                                  ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],"                      \
                                  "\"data_offsets\":[%zu,%zu]}",                                   \
                                  name, dt, cols, off, off + bytes);                               \
        off += bytes;                                                                              \
    } while (0)
    T1("transformer.wte.weight", how == ST_I32 ? "I32" : "F32", 3, 4);
    T1("transformer.wpe.weight", "F32", 2, how == ST_SHAPE ? 5 : 4);
    for (int k = 0; k < 12; k++) {
        char name[80];
        snprintf(name, sizeof name, "transformer.h.0.%s", blk[k]);
        if (how == ST_MISSING && k == 1)
            continue;
        T1(name, "F32", r[k], c[k]);
    }
    T1("transformer.ln_f.weight", "F32", 0, 4);
    T1("transformer.ln_f.bias", "F32", 0, 4);
    if (how == ST_DUP)
        T1("ln_f.bias", "F32", 0, 4);
#undef T1
    n += (size_t)snprintf(h + n, sizeof h - n, "}");
    if (how == ST_JSON)
        h[n - 1] = ','; /* unbalanced */
    size_t data = how == ST_OFFSETS ? off - 4 : off;
    uint64_t hl = how == ST_BIG_HEADER ? n + data + 1 : n;
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fwrite(&hl, 8, 1, f) == 1 && fwrite(h, 1, n, f) == n);
    for (size_t i = 0; i < data; i++)
        fputc(0, f);
    TEST_CHECK(fclose(f) == 0);
}

/* An llm.c checkpoint header (L 1, C 4, T 2, V 3, Vp 4) with the given
 * version and heads, and the parameters it implies (zeros). */
static void llmc_write(const char *path, int version, int heads)
{
    int32_t h[256] = {20240326, version, 2, 3, 1, heads, 4, 4};
    uint64_t P = 4 * 4 + 2 * 4 + (12 * 16 + 13 * 4) + 2 * 4;
    FILE *f = fopen(path, "wb");
    TEST_CHECK(f && fwrite(h, 4, 256, f) == 256);
    for (uint64_t i = 0; i < P * (version == 5 ? 2 : 4); i++)
        fputc(0, f);
    TEST_CHECK(fclose(f) == 0);
}

static void expect_load_error(const char *path, int code, const char *what)
{
    zs_err_t err;
    zs_init_from_t *f = NULL;
    int rc = zs_init_from_load(path, &f, &err);
    TEST_CHECKF(rc == code && !f && strstr(err.msg, what) && strstr(err.msg, path),
                "%s: rc %d, want %d with \"%s\": %s", path, rc, code, what, err.msg);
    printf("   refused: %s\n", err.msg);
}

static void check_reader_refusals(void)
{
    zs_err_t err;
    zs_init_from_t *f;
    printf("0. the reader on crafted files\n");
    st_write(tpath("ok.safetensors"), ST_OK);
    TEST_OK(zs_init_from_load(tpath("ok.safetensors"), &f, &err), err);
    zs_gpt_config_t s = zs_init_from_shape(f);
    TEST_CHECK(s.layers == 1 && s.width == 4 && s.ctx == 2 && s.vocab == 3 && s.heads == 0);
    zs_gpt_config_t c = {4, 4, 128, 64, 256};
    TEST_CHECK(zs_init_from_settle(f, &c, 0, 0, 0, 0, 3, &err) == ZS_ERR_INVALID &&
               strstr(err.msg, "pass --heads")); /* width 4: no GPT-2 head size */
    zs_init_from_free(f);
    static const struct {
        int how;
        const char *what;
    } st[] = {{ST_BIG_HEADER, "does not fit"},
              {ST_JSON, "does not parse"},
              {ST_I32, "dtype I32"},
              {ST_OFFSETS, "data_offsets are not valid"},
              {ST_SHAPE, "has shape [2, 5]"},
              {ST_DUP, "are the same tensor"},
              {ST_MISSING, "[transformer.]h.0.ln_1.bias is missing"}};
    for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
        char name[64];
        snprintf(name, sizeof name, "bad%zu.safetensors", i);
        st_write(tpath(name), st[i].how);
        expect_load_error(tpath(name), ZS_ERR_CORRUPT, st[i].what);
    }
    llmc_write(tpath("ok.bin"), 3, 2);
    TEST_OK(zs_init_from_load(tpath("ok.bin"), &f, &err), err);
    TEST_CHECK(zs_init_from_shape(f).heads == 2);
    zs_init_from_free(f);
    llmc_write(tpath("v5.bin"), 5, 2);
    TEST_OK(zs_init_from_load(tpath("v5.bin"), &f, &err), err);
    zs_init_from_free(f);
    llmc_write(tpath("v4.bin"), 4, 2);
    expect_load_error(tpath("v4.bin"), ZS_ERR_CORRUPT, "version 4");
    llmc_write(tpath("h3.bin"), 3, 3);
    expect_load_error(tpath("h3.bin"), ZS_ERR_CORRUPT, "heads 3, channels 4");
    expect_load_error(tpath("none.bin"), ZS_ERR_NOTFOUND, "cannot open");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(dir, sizeof dir, "%s", zs_test_tmpdir("init-from"));
    check_reader_refusals();
    if (zs_test_sh("%s -c 'import torch' 2>/dev/null", ZS_PYTHON) != 0) {
        printf("SKIP test_init_from: %s cannot import torch (deploy/install-deps.sh installs "
               "python3-torch)\n",
               ZS_PYTHON);
        return 77;
    }
    /* one sequence of T + 1 tokens: every sample is all of it */
    uint16_t tok[T + 1];
    int32_t io[2 * T];
    uint64_t x = 99;
    for (int i = 0; i <= T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (uint16_t)((x >> 33) % V);
    }
    for (int i = 0; i < T; i++) {
        io[i] = tok[i];
        io[T + i] = tok[i + 1];
    }
    zs_err_t err;
    TEST_OK(zs_data_write(tpath("data.tok"), V, tok, T + 1, &err), err);
    FILE *f = fopen(tpath("tokens.bin"), "wb");
    TEST_CHECK(f && fwrite(io, sizeof *io, 2 * T, f) == 2 * T && fclose(f) == 0);
    /* validation tokens: 5 windows of T + 1 starting every T */
    uint16_t vt[5 * T + 1];
    int32_t vt32[5 * T + 1];
    for (int i = 0; i <= 5 * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        vt32[i] = vt[i] = (uint16_t)((x >> 33) % V);
    }
    TEST_OK(zs_data_write(tpath("val.tok"), V, vt, 5 * T + 1, &err), err);
    f = fopen(tpath("val.bin"), "wb");
    TEST_CHECK(f && fwrite(vt32, sizeof *vt32, 5 * T + 1, f) == 5 * T + 1 && fclose(f) == 0);
    TEST_CHECK(zs_test_sh("%s %s/tests/ref/init_from_ref.py write %s %d %d %d %d %d 7", ZS_PYTHON,
                          ZS_SOURCE_DIR, dir, L, NH, C, T, V) == 0);
    double want = read_double(tpath("loss.txt"));

    check_step1("export.safetensors", want, "");
    check_step1("hf.safetensors", want, "");
    check_step1("llmc.bin", want, "");
    check_step1("llmc_bf16.bin", read_double(tpath("loss_bf16.txt")), "");
    /* a split model (wte in layers of 31 vocabulary rows, blocks in parts)
     * reads the same weights: engine layers that cut a tensor */
    f = fopen(tpath("split.json"), "w");
    TEST_CHECK(f);
    fprintf(f, "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 4,"
               " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
               " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1000}}\n");
    TEST_CHECK(fclose(f) == 0);
    char split[400];
    snprintf(split, sizeof split, "--split-layers --config %s", tpath("split.json"));
    check_step1("hf.safetensors", want, split);

    /* 2. train on servers, export, PyTorch and init-from read it back */
    zs_test_server_t srv[2];
    zs_test_servers_up(srv, 2, dir, "s", "--keep 3", g_servers, sizeof g_servers);
    char args[1200];
    snprintf(args, sizeof args,
             "--heads %d --servers %s --steps 3 --ckpt-every 3 --save-params %s --csv %s", NH,
             g_servers, tpath("p3.bin"), tpath("t.csv"));
    TEST_CHECKF(train(tpath("export.safetensors"), tpath("data.tok"), args, tpath("t.log")) == 0,
                "zs-train 3 steps on servers failed (%s)", tpath("t.log"));
    TEST_CHECKF(zs_test_sh("ZS_LOG_LEVEL=warn %s export --servers %s --out %s > %s 2>&1", ZS_CTL,
                           g_servers, tpath("out.safetensors"), tpath("ctl.log")) == 0,
                "zs-ctl export failed (%s)", tpath("ctl.log"));
    /* step 4 from checkpoint 3: its loss is computed on the step-3 weights;
     * the validation loss after step 4 on 5 windows (3 on rank 0, 2 on 1) */
    TEST_CHECKF(zs_test_sh("ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS " -np 2 %s --data %s --servers "
                           "%s --layers %d --heads %d --width %d --ctx %d --resume --steps 4 "
                           "--ckpt-every 4 --val-data %s --val-every 4 --val-tokens %d --csv %s "
                           "--sample-every 4 --sample-tokens 8 --temperature 0 > %s 2>&1",
                           ZS_MPIEXEC, ZS_TRAIN, tpath("data.tok"), g_servers, L, NH, C, T,
                           tpath("val.tok"), 5 * T + 1, tpath("t4.csv"), tpath("t4.log")) == 0,
                "zs-train --resume to step 4 failed (%s)", tpath("t4.log"));
    check_val(tpath("t4.csv"), tpath("t4.log"));
    TEST_CHECK(zs_test_sh("%s %s/tests/ref/init_from_ref.py loss %s %s %d %d %d %d %d > %s",
                          ZS_PYTHON, ZS_SOURCE_DIR, tpath("out.safetensors"), dir, L, NH, C, T, V,
                          tpath("loss4.txt")) == 0);
    double torch4 = read_double(tpath("loss4.txt")), zs4 = zs_test_csv_loss(tpath("t4.csv"), 4);
    printf("2. after 3 steps: PyTorch on the exported file %.6f, zs-train step 4 %.6f (diff "
           "%.2g)\n",
           torch4, zs4, fabs(torch4 - zs4));
    TEST_CHECKF(fabs(torch4 - zs4) <= 2e-5 && fabs(zs4 - want) > 1e-3,
                "exported weights: PyTorch %.6f vs zs-train %.6f (initial %.6f)", torch4, zs4,
                want);
    check_export_bitwise(tpath("out.safetensors"), tpath("p3.bin"));
    check_generate(tpath("out.safetensors"));
    check_generate(tpath("llmc.bin"));
    zs_test_servers_down(srv, 2);

    /* 3. refusals */
    printf("3. refusals\n");
    expect_refusal(tpath("llmc.bin"), tpath("data.tok"), "--layers 3 --steps 1", 2,
                   "--layers 3 disagrees with the 2 layers");
    expect_refusal(tpath("hf.safetensors"), tpath("data.tok"), "--width 64 --heads 4 --steps 1", 2,
                   "--width 64 disagrees with the width 32");
    uint16_t other[40] = {0};
    TEST_OK(zs_data_write(tpath("v256.tok"), 256, other, 40, &err), err);
    expect_refusal(tpath("llmc.bin"), tpath("v256.tok"), "--steps 1", 2,
                   "vocab 256 differs from the llm.c file");
    TEST_CHECK(zs_test_sh("head -c 100000 %s > %s", tpath("llmc.bin"), tpath("cut.bin")) == 0);
    expect_refusal(tpath("cut.bin"), tpath("data.tok"), "--steps 1", 4, "truncated");
    TEST_CHECK(zs_test_sh("sed 's/ln_f.bias/ln_X.bias/' %s > %s", tpath("hf.safetensors"),
                          tpath("nolnf.safetensors")) == 0);
    expect_refusal(tpath("nolnf.safetensors"), tpath("data.tok"), "--heads 4 --steps 1", 4,
                   "is not part of a GPT-2");
    expect_refusal(tpath("llmc.bin"), tpath("data.tok"), "--resume --servers 127.0.0.1:1", 2,
                   "--init-from starts a fresh run");
    printf("test_init_from: all checks passed\n");
    return 0;
}
