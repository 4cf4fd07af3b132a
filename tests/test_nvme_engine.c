/*
 * test_nvme_engine.c - the NVMe tier (zs-server --nvme-path) under the ZeRO
 * engine and zs-train, against real zs-server processes on 127.0.0.1.
 *
 *  1. Equality: tests/engine_worker.c against two NVMe-tier servers and
 *     against two RAM servers ends with bitwise the same parameters, stages
 *     0-3 x W in {1, 2} x fp32/bf16/fp16 (two overflow-skipped steps in
 *     fp16), half of the runs speculating on the servers (super_offload:
 *     the tier keeps its pre-images on the drive; the NVMe servers'
 *     counters must show speculated elements over the matrix), two thirds
 *     with streamed pulls; and a checkpoint written by the NVMe servers, resumed
 *     there, == the uninterrupted run. The second NVMe server builds its
 *     states without the 16-bit copy (ZS_NVME_TEST_NO_LOWP=1, as when it
 *     does not fit the budget), so its pulls cast the tiles' master weights.
 *  2. Configuration: zs-train with offload_optimizer.device "nvme" (and
 *     DeepSpeed's NVMe keys) trains on the NVMe servers, each key's "no
 *     effect" reported once; with a RAM server among them it exits 5 with
 *     one line per rank, naming that server and --nvme-path; device "cpu" trains on the NVMe
 *     servers too (the tier is the server's business).
 *  3. Tools: the same zs-train run (2 steps, a checkpoint) on the RAM
 *     servers and on the NVMe ones: `zs-ctl export --optimizer` of each is
 *     the same file, byte for byte; `zs-ctl reshard` from the two NVMe
 *     servers to one new NVMe server, exported again: the same tensors
 *     (the header names 1 server instead of 2); `zs-ctl status` says which
 *     servers are in the tier.
 *
 * `test_nvme_engine quick` runs one case of 1, then 2 and 3.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_proc.h"
#include "zs_test.h"

#define MPIRUN ZS_MPIEXEC " " ZS_TEST_MPI_OPTS
#define TINY   "--layers 1 --heads 2 --width 16 --ctx 8"

static char g_tmp[200], g_ram_list[256], g_nv_list[256];
static zs_test_server_t g_ram[2], g_nv[2];
static int g_runs;
static unsigned long long g_spec_elements; /* speculated on the NVMe servers, all runs */

static int worker(int np, const char *log, const char *args)
{
    g_runs++;
    return zs_test_sh("ZS_LOG_LEVEL=info timeout -k 10 300 " MPIRUN " -np %d %s %s > %s 2>&1", np,
                      ZS_ENGINE_WORKER, args, log);
}

static void must(int rc, const char *log, const char *what)
{
    if (rc == 0)
        return;
    fprintf(stderr, "FAIL: %s (exit %d); log %s:\n", what, rc, log);
    zs_test_sh("tail -n 40 %s >&2", log);
    exit(1);
}

static int lines_with(const char *log, const char *a, const char *b)
{
    FILE *f = fopen(log, "r");
    TEST_CHECKF(f != NULL, "cannot read %s", log);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, a) && (!b || strstr(line, b));
    fclose(f);
    return n;
}

/* One case on the RAM servers and on the NVMe ones: bitwise equal. */
static void pair(int np, const char *name, const char *args)
{
    char out[2][300], log[2][300], a[2048];
    const char *list[2] = {g_ram_list, g_nv_list}, *tier[2] = {"ram", "nvme"};
    for (int t = 0; t < 2; t++) {
        snprintf(out[t], sizeof out[t], "%s/%s-%s.bin", g_tmp, name, tier[t]);
        snprintf(log[t], sizeof log[t], "%s/%s-%s.log", g_tmp, name, tier[t]);
        snprintf(a, sizeof a, "%s --offload 1 --servers %s --spec-report --out %s", args, list[t],
                 out[t]);
        must(worker(np, log[t], a), log[t], name);
    }
    FILE *f = fopen(log[1], "r");
    TEST_CHECK(f);
    char line[512];
    unsigned long long h, r, e;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "spec hits=%llu rollbacks=%llu elements=%llu", &h, &r, &e) == 3)
            g_spec_elements += e;
    fclose(f);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", out[0], out[1]) == 0,
                "%s (W=%d %s): NVMe-tier and RAM parameters differ", name, np, args);
}

static void equality(int quick)
{
    static const char *dtypes[] = {"fp32", "bf16", "fp16"};
    printf("1. NVMe-tier servers == RAM servers, bitwise\n");
    for (int s = 0; s <= 3; s++)
        for (int W = 1; W <= 2; W++)
            for (int d = 0; d < 3; d++) {
                if (quick && !(s == 2 && W == 2 && d == 1))
                    continue;
                int spec = (s + W + d) % 2, stream = (s + W + d) % 3 != 2;
                char name[64], args[512];
                snprintf(name, sizeof name, "eq-s%d-w%d-%s", s, W, dtypes[d]);
                snprintf(args, sizeof args,
                         "--stage %d --dtype %s --steps 8 --clip 1.0 --spec %d --stream %d %s", s,
                         dtypes[d], spec, stream, d == 2 ? "--inject-nan 5 --inject-count 2" : "");
                pair(W, name, args);
                printf("  stage %d W=%d %s%s%s, %s pulls: NVMe == RAM, bitwise\n", s, W, dtypes[d],
                       d == 2 ? " (2 overflows)" : "", spec ? ", speculation asked" : "",
                       stream ? "streamed" : "synchronous");
            }
    if (!quick) {
        TEST_CHECKF(g_spec_elements > 0, "the NVMe servers speculated nothing in the matrix");
        printf("  the NVMe servers speculated %llu elements over the matrix\n", g_spec_elements);
    }
    if (quick)
        return;
    char out[2][300], log[2][300], a[1024];
    const char *common = "--stage 2 --dtype bf16 --offload 1 --steps 8 --clip 1.0";
    for (int t = 0; t < 2; t++) {
        snprintf(out[t], sizeof out[t], "%s/resume-%d.bin", g_tmp, t);
        snprintf(log[t], sizeof log[t], "%s/resume-%d.log", g_tmp, t);
    }
    snprintf(a, sizeof a, "%s --servers %s --ckpt-every 4 --out %s", common, g_nv_list, out[0]);
    must(worker(2, log[0], a), log[0], "NVMe run with checkpoints");
    snprintf(a, sizeof a, "%s --servers %s --resume --resume-step 4 --out %s", common, g_nv_list,
             out[1]);
    must(worker(2, log[1], a), log[1], "resume on the NVMe servers");
    TEST_CHECKF(lines_with(log[1], "resumed at step 4", NULL) >= 1, "not resumed at 4");
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", out[0], out[1]) == 0,
                "resumed run differs from the uninterrupted one");
    printf("  stage 2 W=2 bf16: checkpoint 4 of the NVMe servers resumed == uninterrupted, "
           "bitwise\n");
}

static void write_config(const char *path, const char *device, const char *keys)
{
    FILE *f = fopen(path, "w");
    TEST_CHECK(f);
    fprintf(
        f,
        "{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 2,\n"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},\n"
        " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"%s\"%s}}}\n",
        device, keys);
    fclose(f);
}

/* zs-train, 2 ranks, 2 steps and a checkpoint, over TCP (the transport is
 * not what is tested here), stopped after 120 s. */
static int train(const char *cfg, const char *servers, const char *log)
{
    char data[300];
    snprintf(data, sizeof data, "%s/corpus.tok", g_tmp);
    return zs_test_sh("cd %s && ZS_LOG_LEVEL=warn timeout -k 10 120 " MPIRUN
                      " -q -np 2 %s --data %s " TINY " --steps 2 --ckpt-every 2 --servers %s "
                      "--transport tcp --config %s --fresh > %s 2>&1",
                      g_tmp, ZS_TRAIN, data, servers, cfg, log);
}

/* The tensor bytes of a .safetensors file (after its JSON header) of a
 * and b are equal, and so is the header but for "zeroshard.servers". */
static int same_tensors(const char *a, const char *b)
{
    char *buf[2] = {NULL, NULL};
    long len[2];
    const char *path[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(path[i], "rb");
        TEST_CHECKF(f, "cannot read %s", path[i]);
        fseek(f, 0, SEEK_END);
        len[i] = ftell(f);
        fseek(f, 0, SEEK_SET);
        buf[i] = malloc((size_t)len[i]);
        TEST_CHECK(buf[i] && fread(buf[i], 1, (size_t)len[i], f) == (size_t)len[i]);
        fclose(f);
    }
    uint64_t n0 = 0, n1 = 0;
    memcpy(&n0, buf[0], 8);
    memcpy(&n1, buf[1], 8);
    int same = len[0] == len[1] && n0 == n1 && 8 + (long)n0 <= len[0] &&
               memcmp(buf[0] + 8 + n0, buf[1] + 8 + n0, (size_t)(len[0] - 8 - (long)n0)) == 0;
    free(buf[0]);
    free(buf[1]);
    return same;
}

static void tools(void)
{
    printf("3. zs-ctl export and reshard from NVMe-tier servers\n");
    char cfg[300], log[300];
    snprintf(cfg, sizeof cfg, "%s/cpu.json", g_tmp);
    snprintf(log, sizeof log, "%s/tools-ram.log", g_tmp);
    must(train(cfg, g_ram_list, log), log, "zs-train on the RAM servers");
    snprintf(cfg, sizeof cfg, "%s/nvme.json", g_tmp);
    snprintf(log, sizeof log, "%s/tools-nvme.log", g_tmp);
    must(train(cfg, g_nv_list, log), log, "zs-train on the NVMe servers");
    snprintf(log, sizeof log, "%s/export.log", g_tmp);
    zs_test_run_ok(log, "%s export --servers %s --optimizer --out %s/ram.safetensors", ZS_CTL,
                   g_ram_list, g_tmp);
    zs_test_run_ok(log, "%s export --servers %s --optimizer --out %s/nvme.safetensors", ZS_CTL,
                   g_nv_list, g_tmp);
    TEST_CHECKF(zs_test_sh("cmp -s %s/ram.safetensors %s/nvme.safetensors", g_tmp, g_tmp) == 0,
                "zs-ctl export of the NVMe servers differs from the RAM servers'");
    printf("  export --optimizer (weights, exp_avg, exp_avg_sq) from NVMe == from RAM, byte for "
           "byte\n");
    zs_test_server_t one = {0};
    snprintf(one.data_dir, sizeof one.data_dir, "%s/one", g_tmp);
    snprintf(one.extra, sizeof one.extra, "--nvme-path %s/one-tiles", g_tmp);
    zs_test_server_start(&one);
    zs_test_run_ok(log, "%s reshard --from %s --to %s", ZS_CTL, g_nv_list, one.addr);
    zs_test_run_ok(log, "%s export --servers %s --optimizer --out %s/one.safetensors", ZS_CTL,
                   one.addr, g_tmp);
    char ra[300], one_f[300];
    snprintf(ra, sizeof ra, "%s/ram.safetensors", g_tmp);
    snprintf(one_f, sizeof one_f, "%s/one.safetensors", g_tmp);
    TEST_CHECKF(same_tensors(ra, one_f), "export after reshard to one NVMe server differs");
    printf("  reshard 2 NVMe servers -> 1 NVMe server, exported: the same tensors, byte for "
           "byte (the header says 1 server)\n");
    const char *groups[3] = {g_nv_list, g_ram_list, one.addr};
    int tier = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(log, sizeof log, "%s/status-%d.log", g_tmp, i);
        zs_test_run_ok(log, "%s status --servers %s", ZS_CTL, groups[i]);
        int k = lines_with(log, "optimizer state in its NVMe tier", NULL);
        TEST_CHECKF(k == (i == 1   ? 0
                          : i == 0 ? 2
                                   : 1),
                    "zs-ctl status of %s: %d servers said to be in the NVMe tier", groups[i], k);
        tier += k;
    }
    TEST_CHECK(tier == 3);
    printf("  zs-ctl status names the 3 NVMe-tier servers of 5\n");
    zs_test_server_stop(&one, SIGTERM);
}

static void configuration(void)
{
    printf("2. offload_optimizer.device \"nvme\" in zs-train\n");
    char data[300], cfg[300], log[300];
    snprintf(data, sizeof data, "%s/corpus.tok", g_tmp);
    zs_test_tokenize(ZS_TOKENIZE, data, "$(" ZS_TEST_LICENCES " | head -n 3)");
    snprintf(cfg, sizeof cfg, "%s/nvme.json", g_tmp);
    write_config(cfg, "nvme",
                 ", \"nvme_path\": \"/local_nvme\", \"buffer_count\": 4, \"pin_memory\": true, "
                 "\"pipeline_read\": false, \"pipeline_write\": false, \"fast_init\": false");
    snprintf(log, sizeof log, "%s/train-nvme.log", g_tmp);
    int rc = train(cfg, g_nv_list, log);
    if (rc != 0)
        zs_test_sh("tail -n 30 %s >&2", log);
    TEST_CHECKF(rc == 0, "zs-train with device nvme on NVMe servers: exit %d", rc);
    static const char *keys[] = {"nvme_path",     "buffer_count",   "pin_memory",
                                 "pipeline_read", "pipeline_write", "fast_init"};
    for (int i = 0; i < 6; i++) {
        char k[96];
        snprintf(k, sizeof k, "offload_optimizer.%s: no effect: ", keys[i]);
        int n = lines_with(log, k, NULL);
        TEST_CHECKF(n == 1, "%s: %d lines '%s' (want 1)", log, n, k);
    }
    printf("  device nvme on NVMe-tier servers: trains; each DeepSpeed NVMe key reported once "
           "as 'no effect'\n");

    /* a RAM server among them: exit 5, one line naming it */
    char mixed[300];
    snprintf(mixed, sizeof mixed, "%s,%s", g_nv[0].addr, g_ram[1].addr);
    snprintf(log, sizeof log, "%s/train-mixed.log", g_tmp);
    rc = train(cfg, mixed, log);
    char who[160];
    snprintf(who, sizeof who, "server 1 (%s): offload_optimizer.device \"nvme\"", g_ram[1].addr);
    int named = lines_with(log, who, "start it with --nvme-path DIR");
    int errors = lines_with(log, "zs-train: rank ", NULL);
    if (rc != 5 || named < 1 || errors != 2)
        zs_test_sh("cat %s >&2", log);
    TEST_CHECKF(rc == 5 && named >= 1 && errors == 2,
                "device nvme with a RAM server: exit %d (want 5), %d lines naming server 1, %d "
                "error lines (want one per rank)",
                rc, named, errors);
    printf("  device nvme with a RAM server: exit 5, one line per rank, naming server 1 (%s)\n",
           g_ram[1].addr);

    snprintf(cfg, sizeof cfg, "%s/cpu.json", g_tmp);
    write_config(cfg, "cpu", "");
    snprintf(log, sizeof log, "%s/train-cpu.log", g_tmp);
    rc = train(cfg, g_nv_list, log);
    TEST_CHECKF(rc == 0, "zs-train with device cpu on NVMe servers: exit %d", rc);
    printf("  device cpu on NVMe-tier servers: trains\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    int quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("nvme_engine"));
    setenv("ZS_LOG_LEVEL", "warn", 1);
    for (int i = 0; i < 2; i++) {
        snprintf(g_ram[i].data_dir, sizeof g_ram[i].data_dir, "%s/r%d", g_tmp, i);
        snprintf(g_ram[i].extra, sizeof g_ram[i].extra, "--keep 3");
        zs_test_server_start(&g_ram[i]);
        snprintf(g_nv[i].data_dir, sizeof g_nv[i].data_dir, "%s/n%d", g_tmp, i);
        snprintf(g_nv[i].extra, sizeof g_nv[i].extra, "--keep 3 --nvme-path %s/n%d-tiles", g_tmp,
                 i);
        if (i == 1) /* its states have no 16-bit copy: pulls read the tiles */
            setenv("ZS_NVME_TEST_NO_LOWP", "1", 1);
        zs_test_server_start(&g_nv[i]);
        unsetenv("ZS_NVME_TEST_NO_LOWP");
    }
    zs_test_server_list(g_ram, 2, g_ram_list, sizeof g_ram_list);
    zs_test_server_list(g_nv, 2, g_nv_list, sizeof g_nv_list);
    equality(quick);
    configuration();
    tools();
    for (int i = 0; i < 2; i++) {
        zs_test_server_stop(&g_ram[i], SIGTERM);
        zs_test_server_stop(&g_nv[i], SIGTERM);
    }
    printf("PASS test_nvme_engine%s (%d engine_worker runs)\n", quick ? " quick" : "", g_runs);
    return 0;
}
