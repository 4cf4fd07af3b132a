/*
 * test_spec_window.c - speculative updates on the shard servers
 * (offload_optimizer.super_offload, issue 18) when a server's pre-image
 * window (zs-server --spec-window) is smaller than its range, through
 * zs-train and 2 real zs-server processes on 127.0.0.1.
 *
 * A GPT of 830208 parameters on 2 servers gives each a range of 415104
 * elements, 7 optimizer chunks of 65536; --spec-window 1536K holds the
 * pre-images (12 B/element) of 2 chunks, so each step speculates on at
 * most 2 chunks of the range and the rest waits for Commit. For each case, zs-train runs twice on
 * fresh servers with the same window, super_offload on and off; the final parameters must be
 * bitwise equal. Cases: W = 1 and 2, stages 0-3, fp32, bf16 and fp16
 * (dynamic loss scale from 2^20, so early steps overflow and are skipped)
 * with clipping at 100 (not triggered), and clipping at 0.01 where every
 * step is rolled back. For the speculative run the servers' counters
 * (Hello) must show that speculation happened and the window bound it:
 * 0 < elements speculated per step <= 2 chunks < the range; steps kept on
 * every server (with clip 0.01: none kept, some rolled back).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_test.h"

#define STEPS    8
#define CHUNK    65536   /* ZS_OPT_CHUNK: the servers speculate per optimizer chunk */
#define WINDOW   "1536K" /* two chunks' pre-images (12 B/element) */
#define WIN_ELEM (2 * CHUNK)
#define SHAPE    "--layers 4 --heads 4 --width 128 --ctx 32"

static char g_tmp[200], g_data[300];

typedef struct {
    int np, stage;
    const char *dtype; /* "fp32", "bf16", "fp16" */
    double clip;
} case_t;

/* Write the case's DeepSpeed config with super_offload on or off. */
static void write_config(const char *path, const case_t *k, int spec)
{
    FILE *f = fopen(path, "w");
    TEST_CHECK(f);
    const char *prec = !strcmp(k->dtype, "bf16")   ? "\"bf16\": {\"enabled\": true},"
                       : !strcmp(k->dtype, "fp16") ? "\"fp16\": {\"enabled\": true, "
                                                     "\"initial_scale_power\": 20},"
                                                   : "";
    fprintf(f,
            "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": %d, %s\n"
            " \"gradient_clipping\": %g,\n"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"weight_decay\": "
            "0.1}},\n"
            " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 20000,\n"
            "   \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": %s}}}\n",
            8 / (2 * k->np), prec, k->clip, k->stage, spec ? "true" : "false");
    TEST_CHECK(fclose(f) == 0);
}

/* One zs-train run on fresh servers; final parameters into `bin`; the
 * servers' counters into info (2). */
static void run(const case_t *k, int spec, const char *bin, zs_server_info_t *info)
{
    char tag[64], cfg[300], log[300], servers[256];
    snprintf(tag, sizeof tag, "w%d-s%d-%s-c%g-%s", k->np, k->stage, k->dtype, k->clip,
             spec ? "spec" : "plain");
    snprintf(cfg, sizeof cfg, "%s/%s.json", g_tmp, tag);
    snprintf(log, sizeof log, "%s/%s.log", g_tmp, tag);
    write_config(cfg, k, spec);
    zs_test_server_t srv[2];
    zs_test_servers_up(srv, 2, g_tmp, tag, "--spec-window " WINDOW, servers, sizeof servers);
    zs_test_run_ok(log,
                   "ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS
                   " -q -np %d %s --device cpu --data %s " SHAPE
                   " --config %s --servers %s --steps %d --log-every %d --save-params %s",
                   ZS_MPIEXEC, k->np, ZS_TRAIN, g_data, cfg, servers, STEPS, STEPS, bin);
    zs_client_opts_t o = {.servers = servers};
    zs_client_t *c;
    zs_err_t err;
    TEST_OK(zs_client_create(&o, &c, &err), err);
    TEST_OK(zs_client_hello(c, "", 0, info, &err), err);
    zs_client_destroy(c);
    zs_test_servers_down(srv, 2);
}

static void one_case(const case_t *k)
{
    char a[300], b[300];
    zs_server_info_t plain[2], spec[2];
    snprintf(a, sizeof a, "%s/plain.bin", g_tmp);
    snprintf(b, sizeof b, "%s/spec.bin", g_tmp);
    run(k, 0, a, plain);
    run(k, 1, b, spec);
    int same = zs_test_sh("cmp -s %s %s", a, b) == 0;
    printf("W=%d stage %d %s clip %g:", k->np, k->stage, k->dtype, k->clip);
    for (int i = 0; i < 2; i++) {
        uint64_t range = spec[i].range_end - spec[i].range_begin;
        uint64_t steps = spec[i].spec_hits + spec[i].spec_rollbacks;
        double per_step = steps ? (double)spec[i].spec_elements / (double)steps : 0;
        printf(" server %d: range %llu, speculated %.0f elements/step (%llu kept, %llu rolled "
               "back);",
               i, (unsigned long long)range, per_step, (unsigned long long)spec[i].spec_hits,
               (unsigned long long)spec[i].spec_rollbacks);
        TEST_CHECKF(range > 2 * WIN_ELEM, "the range (%llu) should exceed the window (%d)",
                    (unsigned long long)range, WIN_ELEM);
        TEST_CHECKF(spec[i].spec_elements > 0, "server %d did not speculate", i);
        TEST_CHECKF(per_step <= (double)WIN_ELEM,
                    "server %d speculated %.0f of %llu elements per step: the window (%d) did not "
                    "bind",
                    i, per_step, (unsigned long long)range, WIN_ELEM);
        if (k->clip >= 1.0)
            TEST_CHECKF(spec[i].spec_hits > 0, "server %d kept no speculative step", i);
        else
            TEST_CHECKF(spec[i].spec_hits == 0 && spec[i].spec_rollbacks > 0,
                        "clip %g: every speculative step must roll back (server %d: %llu kept)",
                        k->clip, i, (unsigned long long)spec[i].spec_hits);
        TEST_CHECKF(plain[i].spec_elements == 0, "super_offload off still speculated");
    }
    printf(" parameters %s\n", same ? "bitwise equal" : "DIFFER");
    TEST_CHECKF(same, "speculative and plain runs differ (%s, %s)", a, b);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("ZS_LOG_LEVEL", "warn", 1);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("spec-window"));
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    zs_test_tokenize(ZS_TOKENIZE, g_data, "$(" ZS_TEST_LICENCES ")");
    static const case_t cases[] = {
        {1, 2, "fp32", 100}, {2, 0, "fp32", 100}, {2, 1, "fp32", 100},  {2, 3, "fp32", 100},
        {2, 2, "bf16", 100}, {1, 3, "fp16", 100}, {2, 2, "fp32", 0.01},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        one_case(&cases[i]);
    printf("test_spec_window: ok (%zu cases, window " WINDOW " = %d elements)\n",
           sizeof cases / sizeof *cases, WIN_ELEM);
    return 0;
}
