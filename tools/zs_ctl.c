/*
 * zs_ctl.c - zs-ctl, the operator's tool for a set of shard servers.
 *
 *   zs-ctl --servers a:p,b:p status             who holds what, steps, counters
 *   zs-ctl --servers ... checkpoints            steps complete on every server
 *   zs-ctl --servers ... checkpoint STEP        write checkpoint STEP now
 *   zs-ctl --servers ... restore STEP           load checkpoint STEP everywhere
 *   zs-ctl --servers ... delete STEP | --keep K remove checkpoints
 *   zs-ctl export --servers ... --out F ...      a checkpoint to one
 *                                                safetensors file
 *                                                (zs_ctl_export.c)
 *   zs-ctl reshard --from ... --to ... ...       a checkpoint from S to S'
 *                                                servers (zs_ctl_reshard.c)
 *   zs-ctl estimate --params N --gpus G ...      model-state memory (no
 *                                                servers: zs_estimate.c)
 *
 * Talks to the servers through the shard client (worker/client/zs_client.h); does
 * not modify anything except through those calls.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client.h"
#include "zs_ctl.h"
#include "zs_estimate.h"
#include "zs_file.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-ctl --servers HOST:PORT[,...] [--token-file F] [--tls-ca F]\n"
               "              status | checkpoints | checkpoint STEP | restore STEP |\n"
               "              delete STEP | delete --keep K\n"
               "       zs-ctl export --servers HOST:PORT[,...] --out FILE.safetensors\n"
               "              [--step S] [--dtype fp32|bf16|fp16] [--optimizer] [--restore]\n"
               "       zs-ctl reshard --from HOST:PORT[,...] --to HOST:PORT[,...] [--step S]\n"
               "              [--restore] [--overwrite]\n"
               "       zs-ctl estimate --params N --gpus G [--nodes n] [--stage S ...]\n"
               "       zs-ctl export|reshard --help: their options\n");
}

/* Index of the first non-option argument (the subcommand), or argc.
 * Options taking a value in the separate-argument form skip it. */
static int command_index(int argc, char **argv)
{
    static const char *const with_value[] = {"--servers", "--token-file", "--tls-ca",
                                             "--keep",    "--out",        "--dtype",
                                             "--step",    "--from",       "--to"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            return i + 1;
        if (argv[i][0] != '-')
            return i;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            if (!strcmp(argv[i], with_value[k]))
                i++;
    }
    return argc;
}

static int status(zs_client_t *c)
{
    int n = zs_client_nservers(c);
    zs_server_info_t *in = calloc((size_t)n, sizeof *in);
    zs_err_t err;
    zs_err_clear(&err);
    if (zs_client_hello(c, "", 0, in, &err)) {
        fprintf(stderr, "zs-ctl: %s\n", err.msg);
        free(in);
        return 1;
    }
    printf("%-22s %-5s %-16s %-24s %8s %8s %10s %10s %9s  %s\n", "server", "index", "model",
           "range", "step", "adam_t", "in MB", "out MB", "opt GB/s", "checkpoints");
    for (int i = 0; i < n; i++) {
        char range[64], ck[256] = "";
        snprintf(range, sizeof range, "[%llu, %llu)", (unsigned long long)in[i].range_begin,
                 (unsigned long long)in[i].range_end);
        size_t off = 0;
        for (size_t k = 0; k < in[i].ncheckpoints && off < sizeof ck - 24; k++)
            off += (size_t)snprintf(ck + off, sizeof ck - off, "%s%llu", k ? "," : "",
                                    (unsigned long long)in[i].checkpoints[k]);
        if (!in[i].initialized) {
            printf("%-22s %-5d (no model yet)\n", zs_client_server(c, i), i);
            continue;
        }
        printf("%-22s %-5u %-16s %-24s %8llu %8llu %10.1f %10.1f %9.2f  %s\n",
               zs_client_server(c, i), in[i].server_index, in[i].model_name, range,
               (unsigned long long)in[i].applied_step, (unsigned long long)in[i].optimizer_step,
               in[i].bytes_in / 1e6, in[i].bytes_out / 1e6, in[i].optimizer_gbps, ck[0] ? ck : "-");
    }
    /* health and memory, one line per server */
    for (int i = 0; i < n; i++) {
        printf("%-22s memory: rss %.1f MB, heap in use %.1f MB, kept free %.1f MB, budget %.1f "
               "MB (%.1f reserved)",
               zs_client_server(c, i), in[i].rss_bytes / 1e6, in[i].heap_in_use / 1e6,
               in[i].heap_free / 1e6, in[i].mem_budget / 1e6, in[i].mem_reserved / 1e6);
        if (in[i].spec_hits || in[i].spec_rollbacks)
            printf("; speculation: %llu steps kept, %llu rolled back",
                   (unsigned long long)in[i].spec_hits, (unsigned long long)in[i].spec_rollbacks);
        if (in[i].nvme)
            printf("; optimizer state in its NVMe tier (--nvme-path)");
        if (in[i].store_degraded)
            printf("; STORE DEGRADED: %s", in[i].store_error[0] ? in[i].store_error : "?");
        printf("\n");
    }
    free(in);
    return 0;
}

int main(int argc, char **argv)
{
    const char *servers = NULL, *token_file = NULL, *ca_file = NULL;
    int keep = 0;
    static const struct option opts[] = {
        {"servers", required_argument, 0, 's'}, {"token-file", required_argument, 0, 't'},
        {"tls-ca", required_argument, 0, 'c'},  {"keep", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int ch, ci = command_index(argc, argv);
    if (ci < argc && !strcmp(argv[ci], "estimate")) /* offline: needs no --servers */
        return zs_estimate_main(argc - ci, argv + ci);
    if (ci < argc && (!strcmp(argv[ci], "export") || !strcmp(argv[ci], "reshard"))) {
        /* Their own options; global ones may come before the command word. */
        char **av = malloc((size_t)argc * sizeof *av);
        if (!av)
            return 1;
        int n = 0;
        for (int i = 0; i < argc; i++)
            if (i != ci)
                av[n++] = argv[i];
        int rc =
            !strcmp(argv[ci], "export") ? zs_ctl_export_main(n, av) : zs_ctl_reshard_main(n, av);
        free(av);
        return rc;
    }
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 's':
            servers = optarg;
            break;
        case 't':
            token_file = optarg;
            break;
        case 'c':
            ca_file = optarg;
            break;
        case 'k':
            keep = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!servers || optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[optind];
    char *token = token_file ? zs_file_read_text(token_file, 4096, 1) : NULL;
    char *ca = ca_file ? zs_file_read_text(ca_file, 1 << 20, 0) : NULL;
    if ((token_file && !token) || (ca_file && !ca)) {
        fprintf(stderr, "zs-ctl: cannot read %s\n", token_file && !token ? token_file : ca_file);
        return 1;
    }
    zs_client_opts_t o = {servers, token, ca, 60000, 2};
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    if (zs_client_create(&o, &c, &err)) {
        fprintf(stderr, "zs-ctl: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    unsigned long long step = optind + 1 < argc ? strtoull(argv[optind + 1], NULL, 10) : 0;
    if (!strcmp(cmd, "status")) {
        rc = status(c);
    } else if (!strcmp(cmd, "checkpoints")) {
        uint64_t steps[ZS_CLIENT_MAX_CKPTS];
        size_t n;
        rc = zs_client_checkpoints(c, steps, ZS_CLIENT_MAX_CKPTS, &n, &err) != 0;
        if (!rc) {
            printf("complete on all %d servers:", zs_client_nservers(c));
            for (size_t k = 0; k < n && k < ZS_CLIENT_MAX_CKPTS; k++)
                printf(" %llu", (unsigned long long)steps[k]);
            printf(n ? "\n" : " none\n");
        }
    } else if ((!strcmp(cmd, "checkpoint") || !strcmp(cmd, "restore")) && step > 0) {
        zs_client_hello(c, "", 0, NULL, &err);
        rc = (!strcmp(cmd, "checkpoint") ? zs_client_checkpoint(c, step, 0, &err)
                                         : zs_client_restore(c, step, &err)) != 0;
        if (!rc)
            printf("%s %llu: done on all servers\n", cmd, step);
    } else if (!strcmp(cmd, "delete") && (step > 0 || keep > 0)) {
        rc = zs_client_delete(c, step, keep, &err) != 0;
        if (!rc)
            printf("delete: done\n");
    } else {
        usage(stderr);
        rc = 2;
    }
    if (rc == 1 && err.msg[0])
        fprintf(stderr, "zs-ctl %s: %s\n", cmd, err.msg);
    zs_client_destroy(c);
    free(token);
    free(ca);
    return rc;
}
