/*
 * zs_demo.c - zs-demo: a small optimisation driven entirely through shard
 * servers, for the quickstart until the ZeRO engine and zs-train land.
 *
 * Problem: minimise L(w) = 0.5 * mean((w - target)^2) over P parameters
 * with noisy gradients g = (w - target) + 0.1 * noise(step), pushed as bf16.
 * Each step: compute g from the pulled fp32 weights, push, commit (AdamW on
 * the servers), pull. Checkpoints every K steps; --resume restores the
 * newest checkpoint complete on every server and continues, so a resumed run
 * reproduces the uninterrupted one bit for bit (the checksum column shows
 * it). Does not: partition work over several processes (zs-train will).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_client.h"
#include "zs_file.h"
#include "zs_rand.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FNV-1a over the bytes of the weights: equal runs print equal checksums. */
static uint64_t checksum(const float *w, uint64_t n)
{
    const unsigned char *p = (const unsigned char *)w;
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n * 4; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-demo --servers HOST:PORT[,...] [options]\n"
               "  --params N       parameters (default 4194304)\n"
               "  --steps N        last step to run (default 60)\n"
               "  --ckpt-every K   checkpoint every K steps (default 20; 0: never)\n"
               "  --lr X           AdamW learning rate (default 0.01)\n"
               "  --model NAME     model name on the servers (default zs-demo)\n"
               "  --resume         continue from the newest complete checkpoint\n"
               "  --csv FILE       write step,loss,push_ms,commit_pull_ms,checksum\n"
               "  --token-file F   bearer token for the servers\n");
}

static void die(const char *what, const zs_err_t *e)
{
    fprintf(stderr, "zs-demo: %s failed: %s\n", what, e->msg);
    exit(1);
}

int main(int argc, char **argv)
{
    const char *servers = NULL, *model = "zs-demo", *csv = NULL, *token_file = NULL;
    uint64_t P = 4194304, steps = 60, every = 20;
    float lr = 0.01f;
    int resume = 0;
    static const struct option opts[] = {{"servers", required_argument, 0, 's'},
                                         {"params", required_argument, 0, 'p'},
                                         {"steps", required_argument, 0, 'n'},
                                         {"ckpt-every", required_argument, 0, 'k'},
                                         {"lr", required_argument, 0, 'l'},
                                         {"model", required_argument, 0, 'm'},
                                         {"resume", no_argument, 0, 'r'},
                                         {"csv", required_argument, 0, 'c'},
                                         {"token-file", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 's':
            servers = optarg;
            break;
        case 'p':
            P = strtoull(optarg, NULL, 10);
            break;
        case 'n':
            steps = strtoull(optarg, NULL, 10);
            break;
        case 'k':
            every = strtoull(optarg, NULL, 10);
            break;
        case 'l':
            lr = strtof(optarg, NULL);
            break;
        case 'm':
            model = optarg;
            break;
        case 'r':
            resume = 1;
            break;
        case 'c':
            csv = optarg;
            break;
        case 't':
            token_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!servers || P == 0 || P > (1ull << 32)) {
        usage(stderr);
        return 2;
    }
    char *token = token_file ? zs_file_read_text(token_file, 4096, 1) : NULL;
    if (token_file && !token) {
        fprintf(stderr, "zs-demo: cannot read %s\n", token_file);
        return 1;
    }
    zs_client_opts_t o = {servers, token, NULL, 120000, 0};
    zs_client_t *c;
    zs_err_t err;
    if (zs_client_create(&o, &c, &err))
        die("connect", &err);
    float *w = malloc(P * 4), *g = malloc(P * 4), *target = malloc(P * 4);
    uint16_t *g16 = malloc(P * 2);
    if (!w || !g || !target || !g16) {
        fprintf(stderr, "zs-demo: out of memory for %llu parameters\n", (unsigned long long)P);
        return 1;
    }
    for (uint64_t i = 0; i < P; i++)
        target[i] = zs_rand_unit(7, i);

    uint64_t step = 0;
    if (resume) {
        if (zs_client_hello(c, model, P, NULL, &err))
            die("hello", &err);
        uint64_t ck[ZS_CLIENT_MAX_CKPTS];
        size_t n;
        if (zs_client_checkpoints(c, ck, ZS_CLIENT_MAX_CKPTS, &n, &err))
            die("list checkpoints", &err);
        if (n == 0) {
            fprintf(stderr, "zs-demo: --resume, but no checkpoint is complete on all servers\n");
            return 1;
        }
        step = ck[(n < ZS_CLIENT_MAX_CKPTS ? n : ZS_CLIENT_MAX_CKPTS) - 1];
        if (zs_client_restore(c, step, &err))
            die("restore", &err);
        printf("resumed from checkpoint %llu (complete on all %d servers)\n",
               (unsigned long long)step, zs_client_nservers(c));
    } else {
        for (uint64_t i = 0; i < P; i++)
            w[i] = 0.5f * zs_rand_unit(3, i);
        zs_adam_hparams_t hp = {lr, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
        if (zs_client_init(c, model, P, &hp, w, 0, 1, &err))
            die("initialize", &err);
        printf("initialized '%s': %llu parameters over %d servers (AdamW lr %g)\n", model,
               (unsigned long long)P, zs_client_nservers(c), lr);
    }
    if (zs_client_pull(c, step, 0, P, w, ZS_DTYPE_F32, NULL, &err))
        die("pull", &err);
    FILE *out = csv ? fopen(csv, resume ? "a" : "w") : NULL;
    if (out && !resume)
        fprintf(out, "step,loss,push_ms,commit_pull_ms,checksum\n");
    printf("%6s %12s %9s %14s %9s  %s\n", "step", "loss", "push ms", "commit+pull ms", "MB/s",
           "checksum");
    for (uint64_t s = step + 1; s <= steps; s++) {
        double loss = 0;
        for (uint64_t i = 0; i < P; i++) {
            float d = w[i] - target[i];
            loss += 0.5 * (double)d * d;
            g[i] = d + 0.1f * zs_rand_unit(s, i);
        }
        loss /= (double)P;
        zs_cast(g16, ZS_DTYPE_BF16, g, ZS_DTYPE_F32, P);
        double t0 = now();
        if (zs_client_push(c, s, 0, P, g16, ZS_DTYPE_BF16, &err))
            die("push", &err);
        double t1 = now();
        zs_step_scalars_t sc = {s, 1.0f, 1.0f, lr, 0, ZS_DTYPE_NONE};
        if (zs_client_commit(c, &sc, &err))
            die("commit", &err);
        if (zs_client_pull(c, s, 0, P, w, ZS_DTYPE_F32, NULL, &err))
            die("pull", &err);
        double t2 = now();
        uint64_t sum = checksum(w, P);
        double mbs = (double)P * 6 / 1e6 / (t2 - t0);
        printf("%6llu %12.6f %9.1f %14.1f %9.0f  %016llx\n", (unsigned long long)s, loss,
               (t1 - t0) * 1e3, (t2 - t1) * 1e3, mbs, (unsigned long long)sum);
        if (out)
            fprintf(out, "%llu,%.8f,%.3f,%.3f,%016llx\n", (unsigned long long)s, loss,
                    (t1 - t0) * 1e3, (t2 - t1) * 1e3, (unsigned long long)sum);
        fflush(stdout);
        if (every && s % every == 0) {
            double t3 = now();
            if (zs_client_checkpoint(c, s, 0, &err))
                die("checkpoint", &err);
            printf("       checkpoint %llu durable on all servers (%.0f ms, %.1f MB of state)\n",
                   (unsigned long long)s, (now() - t3) * 1e3, 12.0 * (double)P / 1e6);
        }
    }
    if (out)
        fclose(out);
    zs_client_destroy(c);
    free(w);
    free(g);
    free(g16);
    free(target);
    free(token);
    return 0;
}
