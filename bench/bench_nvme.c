/*
 * bench_nvme.c - the driver of bench/bench_nvme.sh: times one zs-server's
 * steps (push -> update -> pull) and a checkpoint, through the C client.
 * Knows nothing about the tier: the script starts the server with or
 * without --nvme-path and compares.
 *
 * Run: bench_nvme HOST:PORT P STEPS
 *   Initialize P elements (one server), then STEPS steps of bf16 gradients
 *   with bf16 pulls, then a checkpoint. Per step: push, commit, and pull
 *   seconds from the client, and the server's own pass time (Hello's
 *   last_step_ms). Prints, medians over the steps after the first:
 *     NVME-PASS n=P pass_s=X phase_s=Y ckpt_s=Z rss_mb=R
 *     NVME-MEM idle_rss_mb=A steps_rss_mb=B steps_heap_mb=H reserved_mb=C rss_mb=R
 *   (phase_s: push + commit + pull as the worker sees it; from Hello: the
 *   server's resident memory before Initialize (A: gRPC, RocksDB, threads),
 *   after the steps (B; H of it the allocator's heap in use, C reserved
 *   against the budget then) and after the checkpoint (R)).
 *
 * Does not: start servers, run fio, or assert anything.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_cast.h"
#include "zs_client.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        if ((expr) != 0) {                                                                         \
            fprintf(stderr, "bench_nvme: %s: %s\n", #expr, err.msg);                               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_nvme HOST:PORT P STEPS\n");
        return 2;
    }
    uint64_t P = strtoull(argv[2], NULL, 10);
    int steps = atoi(argv[3]);
    if (P == 0 || steps < 2 || steps > 100) {
        fprintf(stderr, "bench_nvme: P > 0 and 2 <= STEPS <= 100\n");
        return 2;
    }
    zs_err_t err = {0, ""};
    zs_client_opts_t o = {0};
    o.servers = argv[1];
    o.timeout_ms = 600000;
    o.transport = ZS_TRANSPORT_TCP;
    zs_client_t *c;
    CHECK(zs_client_create(&o, &c, &err));
    zs_server_info_t idle;
    CHECK(zs_client_hello(c, "", 0, &idle, &err));
    float *w = malloc(P * 4);
    uint16_t *g = malloc(P * 2), *pulled = malloc(P * 2);
    if (!w || !g || !pulled) {
        fprintf(stderr, "bench_nvme: out of memory for %llu elements\n", (unsigned long long)P);
        return 1;
    }
    for (uint64_t i = 0; i < P; i++)
        w[i] = 0.01f * (float)((i * 2654435761u) % 1000) / 1000.0f;
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    CHECK(zs_client_init(c, "bench-nvme", P, &hp, w, 0, 1, &err));
    for (uint64_t i = 0; i < P; i++)
        w[i] = 1e-3f * (float)((i * 40503u) % 2001) - 1.0f;
    zs_cast(g, ZS_DTYPE_BF16, w, ZS_DTYPE_F32, (size_t)P);
    free(w);
    double pass[100], phase[100];
    for (int s = 1; s <= steps; s++) {
        double t0 = now_s();
        CHECK(zs_client_push(c, (uint64_t)s, 0, P, g, ZS_DTYPE_BF16, &err));
        zs_step_scalars_t sc = {(uint64_t)s, 1.0f, 1.0f, 1e-3f, 0, ZS_DTYPE_BF16};
        CHECK(zs_client_commit(c, &sc, &err));
        uint64_t got;
        CHECK(zs_client_pull(c, (uint64_t)s, 0, P, pulled, ZS_DTYPE_BF16, &got, &err));
        phase[s - 1] = now_s() - t0;
        zs_server_info_t in;
        CHECK(zs_client_hello(c, "", 0, &in, &err));
        pass[s - 1] = in.last_step_ms / 1e3;
        fprintf(stderr, "step %d: pass %.3f s, push+update+pull %.3f s\n", s, pass[s - 1],
                phase[s - 1]);
    }
    zs_server_info_t after;
    CHECK(zs_client_hello(c, "", 0, &after, &err));
    double t0 = now_s();
    CHECK(zs_client_checkpoint(c, (uint64_t)steps, 1, &err));
    double ckpt = now_s() - t0;
    zs_server_info_t in;
    CHECK(zs_client_hello(c, "", 0, &in, &err));
    printf("NVME-PASS n=%llu pass_s=%.4f phase_s=%.4f ckpt_s=%.3f rss_mb=%.1f\n",
           (unsigned long long)P, median(pass + 1, steps - 1), median(phase + 1, steps - 1), ckpt,
           (double)in.rss_bytes / 1e6);
    printf("NVME-MEM idle_rss_mb=%.1f steps_rss_mb=%.1f steps_heap_mb=%.1f reserved_mb=%.1f "
           "rss_mb=%.1f\n",
           (double)idle.rss_bytes / 1e6, (double)after.rss_bytes / 1e6,
           (double)after.heap_in_use / 1e6, (double)after.mem_reserved / 1e6,
           (double)in.rss_bytes / 1e6);
    free(g);
    free(pulled);
    zs_client_destroy(c);
    return 0;
}
