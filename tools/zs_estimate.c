/*
 * zs_estimate.c - `zs-ctl estimate`: ZeRO model-state memory per GPU and per
 * host (formulas in zs_estimate.h, seeds/003).
 *
 * All arithmetic is in whole bytes (uint64): a partitioned term is the
 * largest rank's share, bytes_per_param * ceil(Ψ/N), so the figures are
 * exact, and equal to the seed's when N divides Ψ. GB means 1e9 bytes.
 */
#define _GNU_SOURCE
#include "zs_estimate.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GB 1e9

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* Compute an estimate. */
int zs_estimate(uint64_t params, int gpus, int nodes, int stage, int offload_optimizer,
                int offload_param, zs_estimate_t *out, zs_err_t *err)
{
    if (!out)
        return zs_err_set(err, ZS_ERR_INVALID, "zs_estimate: out must not be NULL");
    if (params < 1 || params > ZS_ESTIMATE_MAX_PARAMS)
        return zs_err_set(err, ZS_ERR_RANGE, "--params %llu: must be 1..%llu",
                          (unsigned long long)params, (unsigned long long)ZS_ESTIMATE_MAX_PARAMS);
    if (gpus < 1)
        return zs_err_set(err, ZS_ERR_RANGE, "--gpus %d: must be >= 1", gpus);
    if (nodes < 1 || nodes > gpus)
        return zs_err_set(err, ZS_ERR_RANGE, "--nodes %d: must be 1..%d (the number of GPUs)",
                          nodes, gpus);
    if (stage < 0 || stage > 3)
        return zs_err_set(err, ZS_ERR_RANGE, "--stage %d: must be 0, 1, 2 or 3", stage);
    if (offload_param && stage != 3)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "--offload-param needs stage 3 (parameters are partitioned only "
                          "there), --stage is %d",
                          stage);
    memset(out, 0, sizeof *out);
    out->params = params;
    out->gpus = gpus;
    out->nodes = nodes;
    out->stage = stage;
    out->offload_optimizer = offload_optimizer != 0;
    out->offload_param = offload_param != 0;

    uint64_t part = ceil_div(params, (uint64_t)gpus); /* largest partition, parameters */
    uint64_t p = stage >= 3 ? 2 * part : 2 * params;
    uint64_t g = stage >= 2 ? 2 * part : 2 * params;
    uint64_t o = stage >= 1 ? 12 * part : 12 * params;
    if (out->offload_optimizer) {
        out->host_optimizer = 12 * ceil_div(params, (uint64_t)nodes);
        o = 0;
    }
    if (out->offload_param) {
        out->host_params = ceil_div((uint64_t)gpus, (uint64_t)nodes) * p;
        p = 0;
    }
    out->gpu_params = p;
    out->gpu_grads = g;
    out->gpu_optimizer = o;
    out->gpu_total = p + g + o;
    out->host_total = out->host_optimizer + out->host_params;
    return ZS_OK;
}

/* Parse "7B", "1.5e9", "125M", "350000". */
int zs_estimate_parse_count(const char *s, uint64_t *out, zs_err_t *err)
{
    if (!s || !*s)
        return zs_err_set(err, ZS_ERR_INVALID, "--params: empty (give e.g. 7B, 1.5e9, 125M)");
    size_t n = strspn(s, "0123456789.eE+-");
    if (n == 0 || n >= 64)
        return zs_err_set(err, ZS_ERR_INVALID, "--params %s: not a number", s);
    double mult = 1;
    const char *suf = s + n;
    if (*suf) {
        switch (*suf) {
        case 'k':
        case 'K':
            mult = 1e3;
            break;
        case 'm':
        case 'M':
            mult = 1e6;
            break;
        case 'b':
        case 'B':
        case 'g':
        case 'G':
            mult = 1e9;
            break;
        case 't':
        case 'T':
            mult = 1e12;
            break;
        default:
            mult = 0;
        }
        if (mult == 0 || suf[1] != '\0')
            return zs_err_set(err, ZS_ERR_INVALID,
                              "--params %s: unknown suffix \"%s\" (use K, M, B or T)", s, suf);
    }
    char num[64];
    memcpy(num, s, n);
    num[n] = '\0';
    char *end;
    double v = strtod(num, &end);
    if (*end != '\0' || !isfinite(v))
        return zs_err_set(err, ZS_ERR_INVALID, "--params %s: not a number", s);
    v *= mult;
    if (!(v >= 0.5) || v > (double)ZS_ESTIMATE_MAX_PARAMS)
        return zs_err_set(err, ZS_ERR_RANGE, "--params %s: must be 1..%llu parameters", s,
                          (unsigned long long)ZS_ESTIMATE_MAX_PARAMS);
    double r = floor(v + 0.5);
    if (fabs(v - r) > 1e-9 * v) /* decimal-to-binary error only, e.g. 1.3B */
        return zs_err_set(err, ZS_ERR_INVALID, "--params %s: %.17g is not a whole number", s, v);
    *out = (uint64_t)r;
    return ZS_OK;
}

/* ---- printing ------------------------------------------------------------- */

/* GB with up to 6 decimals, trailing zeros dropped: 38.5, 14, 1.75. */
static const char *gbs(uint64_t bytes, char *buf, size_t len)
{
    snprintf(buf, len, "%.6f", (double)bytes / GB);
    char *dot = strchr(buf, '.');
    if (dot) {
        char *e = buf + strlen(buf) - 1;
        while (e > dot && *e == '0')
            *e-- = '\0';
        if (e == dot)
            *e = '\0';
    }
    return buf;
}

/* fputs s padded with spaces to `width` characters (UTF-8 aware: Ψ is one). */
static void pad(FILE *f, const char *s, int width)
{
    int chars = 0;
    for (const char *c = s; *c; c++)
        chars += ((unsigned char)*c & 0xc0) != 0x80;
    fputs(s, f);
    for (; chars < width; chars++)
        fputc(' ', f);
}

/* "2Ψ + 2Ψ/N + 12Ψ/N" (the terms on the GPU) and the same in GB. */
static void gpu_formula(const zs_estimate_t *e, char *sym, size_t slen, char *num, size_t nlen)
{
    const char *t[3];
    uint64_t b[3];
    int k = 0;
    if (!e->offload_param) {
        t[k] = e->stage >= 3 ? "2Ψ/N" : "2Ψ";
        b[k++] = e->gpu_params;
    }
    t[k] = e->stage >= 2 ? "2Ψ/N" : "2Ψ";
    b[k++] = e->gpu_grads;
    if (!e->offload_optimizer) {
        t[k] = e->stage >= 1 ? "12Ψ/N" : "12Ψ";
        b[k++] = e->gpu_optimizer;
    }
    size_t so = 0, no = 0;
    char g[32];
    for (int i = 0; i < k; i++) {
        so += (size_t)snprintf(sym + so, slen - so, "%s%s", i ? " + " : "", t[i]);
        no += (size_t)snprintf(num + no, nlen - no, "%s%s", i ? " + " : "", gbs(b[i], g, sizeof g));
    }
    if (k == 1) /* one term: "2Ψ/N = 1.75 GB", not "2Ψ/N = 1.75 = 1.75 GB" */
        num[0] = '\0';
}

static void host_formula(const zs_estimate_t *e, char *sym, size_t slen)
{
    if (e->offload_optimizer && e->offload_param)
        snprintf(sym, slen, "12Ψ/n + (N/n)·2Ψ/N");
    else if (e->offload_optimizer)
        snprintf(sym, slen, "12Ψ/n");
    else if (e->offload_param)
        snprintf(sym, slen, "(N/n)·2Ψ/N");
    else
        snprintf(sym, slen, "0");
}

static void row(FILE *f, const char *what, uint64_t bytes, const char *note)
{
    fprintf(f, "  %-12s %20llu B %12.2f GB%s%s\n", what, (unsigned long long)bytes,
            (double)bytes / GB, note ? "  " : "", note ? note : "");
}

static void legend(FILE *f, uint64_t params, int gpus, int nodes)
{
    fprintf(f,
            "Ψ = %llu parameters, N = %d GPU%s, n = %d host%s\n"
            "mixed precision + Adam: params 2Ψ (fp16/bf16), grads 2Ψ, optimizer states 12Ψ\n"
            "(fp32 master weights + momentum + variance); 1 GB = 1e9 bytes; activations and\n"
            "buffers are not model states and are not counted\n",
            (unsigned long long)params, gpus, gpus == 1 ? "" : "s", nodes, nodes == 1 ? "" : "s");
}

/* Print one configuration in detail. */
void zs_estimate_print(const zs_estimate_t *e, FILE *f)
{
    char sym[96], num[128], g[32], hs[64];
    fprintf(f, "ZeRO stage %d%s%s\n", e->stage,
            e->offload_optimizer ? ", offload_optimizer (shard servers)" : "",
            e->offload_param ? ", offload_param (host memory)" : "");
    legend(f, e->params, e->gpus, e->nodes);
    gpu_formula(e, sym, sizeof sym, num, sizeof num);
    fprintf(f, "\nper GPU: %s = %s%s%s GB\n", sym, num, num[0] ? " = " : "",
            gbs(e->gpu_total, g, sizeof g));
    row(f, "params", e->gpu_params, e->offload_param ? "(offloaded to host memory)" : NULL);
    row(f, "grads", e->gpu_grads, NULL);
    row(f, "optimizer", e->gpu_optimizer,
        e->offload_optimizer ? "(offloaded to the shard servers)" : NULL);
    row(f, "total", e->gpu_total, NULL);
    host_formula(e, hs, sizeof hs);
    if (e->host_total)
        fprintf(f, "\nper host (shard server + offloaded params), %d host%s: %s = %s GB\n",
                e->nodes, e->nodes == 1 ? "" : "s", hs, gbs(e->host_total, g, sizeof g));
    else
        fprintf(f, "\nper host (shard server + offloaded params), %d host%s: 0 GB (no offload)\n",
                e->nodes, e->nodes == 1 ? "" : "s");
    row(f, "optimizer", e->host_optimizer,
        e->offload_optimizer ? "(shard server: 12 bytes x its range of ceil(Ψ/n) parameters)"
                             : "(none: the optimizer runs on the GPUs)");
    row(f, "params", e->host_params,
        e->offload_param ? "(2Ψ/N for each of the host's ceil(N/n) GPUs)" : NULL);
    row(f, "total", e->host_total, NULL);
    fprintf(f, "\nall %d GPU%s together: %s GB; all hosts together: %s GB\n", e->gpus,
            e->gpus == 1 ? "" : "s", gbs(e->gpu_total * (uint64_t)e->gpus, num, sizeof num),
            gbs(e->host_total * (uint64_t)e->nodes, g, sizeof g));
}

/* Print the table of every configuration. */
int zs_estimate_print_table(uint64_t params, int gpus, int nodes, FILE *f, zs_err_t *err)
{
    static const struct {
        int stage, oo, op;
    } cfgs[] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {0, 1, 0},
                {1, 1, 0}, {2, 1, 0}, {3, 1, 0}, {3, 0, 1}, {3, 1, 1}};
    zs_estimate_t e;
    int rc = zs_estimate(params, gpus, nodes, 0, 0, 0, &e, err);
    if (rc != ZS_OK)
        return rc;
    legend(f, params, gpus, nodes);
    fputc('\n', f);
    pad(f, "stage", 7);
    pad(f, "offload", 19);
    pad(f, "per GPU", 22);
    fprintf(f, "%12s  ", "GB per GPU");
    pad(f, "per host", 20);
    fprintf(f, "%12s\n", "GB per host");
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        if ((rc = zs_estimate(params, gpus, nodes, cfgs[i].stage, cfgs[i].oo, cfgs[i].op, &e,
                              err)) != ZS_OK)
            return rc;
        char st[8], sym[96], num[128], hs[64];
        snprintf(st, sizeof st, "%d", e.stage);
        gpu_formula(&e, sym, sizeof sym, num, sizeof num);
        host_formula(&e, hs, sizeof hs);
        pad(f, st, 7);
        pad(f,
            e.offload_optimizer && e.offload_param ? "optimizer + param"
            : e.offload_optimizer                  ? "optimizer"
            : e.offload_param                      ? "param"
                                                   : "-",
            19);
        pad(f, sym, 22);
        fprintf(f, "%12.2f  ", (double)e.gpu_total / GB);
        pad(f, hs, 20);
        fprintf(f, "%12.2f\n", (double)e.host_total / GB);
    }
    return ZS_OK;
}

/* Compute a GPT's activations per GPU (zs_estimate.h). */
int zs_estimate_act(int layers, int heads, int width, int ctx, int vocab, int micro_batch, int ckpt,
                    int cpu, int act16, zs_estimate_act_t *out, zs_err_t *err)
{
    if (layers < 1 || heads < 1 || width < 1 || ctx < 1 || vocab < 1 || micro_batch < 1 ||
        width % heads)
        return zs_err_set(err, ZS_ERR_RANGE,
                          "GPT shape --layers %d --heads %d --width %d --ctx %d --vocab %d "
                          "--micro-batch %d: all must be >= 1, width a multiple of heads",
                          layers, heads, width, ctx, vocab, micro_batch);
    if (cpu && !ckpt)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "--cpu-checkpointing needs --activation-checkpointing");
    memset(out, 0, sizeof *out);
    out->layers = layers, out->heads = heads, out->width = width, out->ctx = ctx;
    out->vocab = vocab, out->micro_batch = micro_batch, out->ckpt = ckpt, out->cpu = cpu;
    out->act16 = act16;
    uint64_t L = (uint64_t)layers, C = (uint64_t)width, V = (uint64_t)vocab;
    uint64_t N = (uint64_t)micro_batch * (uint64_t)ctx;
    uint64_t w = N * (15 * C + 4) + (uint64_t)micro_batch * (uint64_t)heads * ctx * ctx;
    /* the logits' rows are padded to 64 floats (zs_gpt.h, ZS_GPT_LOGITS_LD) */
    uint64_t Vp = (V + 63) / 64 * 64;
    uint64_t h = N * C + N * (C + 2) + N * Vp + 4 * N;
    uint64_t ckpts = L * N * C;
    if (act16) { /* zs_estimate.h: the 16-bit formulas */
        uint64_t hp = N * (C + Vp + 6), sb = w - 4 * N;
        out->gpu_checkpoints = cpu ? 0 : 2 * ckpts;
        out->gpu_blocks = 4 * w + (ckpt ? 0 : 16 * N * (L - 1) + 2 * L * sb);
        out->gpu_other = 4 * N * C + 4 * hp + 2 * N * C + (cpu ? 2 * N * C : 0);
        out->host_pinned = cpu ? 2 * ckpts : 0;
        out->gpu_total = out->gpu_checkpoints + out->gpu_blocks + out->gpu_other;
        return ZS_OK;
    }
    out->gpu_checkpoints = cpu ? 0 : 4 * ckpts;
    out->gpu_blocks = 4 * (ckpt ? w : L * w);
    out->gpu_other = 4 * (cpu ? N * C + h : h);
    out->host_pinned = cpu ? 4 * ckpts : 0;
    out->gpu_total = out->gpu_checkpoints + out->gpu_blocks + out->gpu_other;
    return ZS_OK;
}

/* Print the three modes (zs_estimate.h). */
void zs_estimate_print_act(const zs_estimate_act_t *a, FILE *f)
{
    static const char *names[3] = {"no checkpointing", "checkpointing", "cpu_checkpointing"};
    static const char *forms[3] = {"L·B·T·C + L·w + h", "L·B·T·C + w + h",
                                   "B·T·C + w + h (+ L·B·T·C pinned on the host)"};
    int sel = a->cpu ? 2 : a->ckpt;
    fprintf(f,
            "\nactivations per GPU (%s), GPT L=%d NH=%d C=%d T=%d V=%d, micro-batch B=%d:\n"
            "  w = B·T·(15C + 4) + B·NH·T² (one block), h = B·T·(2C + V + 6) (head, loss, "
            "tokens)\n",
            a->act16 ? "16-bit saved tensors; formulas for fp32 in zs_estimate.h" : "fp32",
            a->layers, a->heads, a->width, a->ctx, a->vocab, a->micro_batch);
    for (int m = 0; m < 3; m++) {
        zs_estimate_act_t x;
        if (zs_estimate_act(a->layers, a->heads, a->width, a->ctx, a->vocab, a->micro_batch, m > 0,
                            m == 2, a->act16, &x, NULL) != ZS_OK)
            return;
        fprintf(f, "  %c ", m == sel ? '*' : ' ');
        pad(f, names[m], 19);
        pad(f, forms[m], 45);
        fprintf(f, "%14llu B %10.4f GB", (unsigned long long)x.gpu_total, (double)x.gpu_total / GB);
        if (x.host_pinned)
            fprintf(f, " + %.4f GB pinned", (double)x.host_pinned / GB);
        fputc('\n', f);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: zs-ctl estimate --params N --gpus G [--nodes n]\n"
               "                       [--stage S [--offload-optimizer] [--offload-param]]\n"
               "  Model-state memory of ZeRO (mixed precision + Adam) per GPU and per host.\n"
               "  --params N           parameters: 7B, 1.5e9, 125M, 350K, 1T or a plain integer\n"
               "  --gpus G             GPUs in total (the data-parallel world size N)\n"
               "  --nodes n            hosts (default 1); one shard server per host\n"
               "  --stage S            0-3; without it, a table of every configuration\n"
               "  --offload-optimizer  optimizer states on the shard servers (12Ψ over n hosts)\n"
               "  --offload-param      stage 3: parameter partitions in host memory\n"
               "  --layers L --heads NH --width C --ctx T --vocab V --micro-batch B\n"
               "                       a GPT shape: its activations per GPU are printed too\n"
               "                       (and --params may be left out: the GPT's count)\n"
               "  --activation-checkpointing  activations with a checkpoint per block\n"
               "  --cpu-checkpointing  ... and the checkpoints in pinned host memory\n"
               "  --activations-16     saved activations in bf16/fp16 (zs-train's default for a\n"
               "                       bf16/fp16 config)\n");
}

static int parse_int(const char *opt, const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 0 || v > 1 << 24) {
        fprintf(stderr, "zs-ctl estimate: %s %s: not a whole number in 0..%d\n", opt, s, 1 << 24);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The `zs-ctl estimate` subcommand. */
int zs_estimate_main(int argc, char **argv)
{
    static const struct option opts[] = {{"params", required_argument, 0, 'p'},
                                         {"gpus", required_argument, 0, 'g'},
                                         {"nodes", required_argument, 0, 'n'},
                                         {"stage", required_argument, 0, 's'},
                                         {"offload-optimizer", no_argument, 0, 'o'},
                                         {"offload-param", no_argument, 0, 'P'},
                                         {"help", no_argument, 0, 'h'},
                                         {"layers", required_argument, 0, 1000},
                                         {"heads", required_argument, 0, 1001},
                                         {"width", required_argument, 0, 1002},
                                         {"ctx", required_argument, 0, 1003},
                                         {"vocab", required_argument, 0, 1004},
                                         {"micro-batch", required_argument, 0, 1005},
                                         {"activation-checkpointing", no_argument, 0, 1006},
                                         {"cpu-checkpointing", no_argument, 0, 1007},
                                         {"activations-16", no_argument, 0, 1008},
                                         {0, 0, 0, 0}};
    const char *params_s = NULL;
    int gpus = -1, nodes = 1, stage = -1, oo = 0, op = 0, ch;
    /* GPT shape (layers, heads, width, ctx, vocab, micro-batch; 0 = not
     * given) and the checkpointing mode */
    int shape[6] = {0, 0, 0, 0, 0, 0}, ac = 0, acpu = 0, a16 = 0;
    static const char *shape_opt[6] = {"--layers", "--heads", "--width",
                                       "--ctx",    "--vocab", "--micro-batch"};
    zs_err_t err;
    optind = 0; /* full getopt re-initialisation (glibc) */
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'p':
            params_s = optarg;
            break;
        case 'g':
            if (parse_int("--gpus", optarg, &gpus))
                return 2;
            break;
        case 'n':
            if (parse_int("--nodes", optarg, &nodes))
                return 2;
            break;
        case 's':
            if (parse_int("--stage", optarg, &stage))
                return 2;
            break;
        case 'o':
            oo = 1;
            break;
        case 'P':
            op = 1;
            break;
        case 1000:
        case 1001:
        case 1002:
        case 1003:
        case 1004:
        case 1005:
            if (parse_int(shape_opt[ch - 1000], optarg, &shape[ch - 1000]))
                return 2;
            break;
        case 1006:
            ac = 1;
            break;
        case 1007:
            acpu = 1;
            break;
        case 1008:
            a16 = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zs-ctl estimate: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    int nshape = 0;
    for (int i = 0; i < 6; i++)
        nshape += shape[i] > 0;
    if (nshape && nshape < 6) {
        fprintf(stderr, "zs-ctl estimate: a GPT shape needs all of --layers --heads --width "
                        "--ctx --vocab --micro-batch\n");
        return 2;
    }
    if ((ac || acpu || a16) && !nshape) {
        fprintf(stderr, "zs-ctl estimate: --activation-checkpointing, --cpu-checkpointing and "
                        "--activations-16 need a GPT shape (--layers ... --micro-batch)\n");
        return 2;
    }
    zs_estimate_act_t act;
    if (nshape && zs_estimate_act(shape[0], shape[1], shape[2], shape[3], shape[4], shape[5],
                                  ac || acpu, acpu, a16, &act, &err) != ZS_OK) {
        fprintf(stderr, "zs-ctl estimate: %s\n", err.msg);
        return 2;
    }
    if ((!params_s && !nshape) || gpus < 0) {
        fprintf(stderr, "zs-ctl estimate: --params and --gpus are required (a GPT shape may "
                        "stand for --params)\n");
        usage(stderr);
        return 2;
    }
    uint64_t params;
    if (!params_s) { /* the GPT's parameters (zs_gpt_num_params) */
        uint64_t L = (uint64_t)shape[0], C = (uint64_t)shape[2];
        params =
            (uint64_t)shape[4] * C + (uint64_t)shape[3] * C + L * (12 * C * C + 13 * C) + 2 * C;
    } else if (zs_estimate_parse_count(params_s, &params, &err) != ZS_OK) {
        fprintf(stderr, "zs-ctl estimate: %s\n", err.msg);
        return 2;
    }
    if (stage < 0 && (oo || op)) {
        fprintf(stderr, "zs-ctl estimate: --offload-optimizer and --offload-param need --stage "
                        "(without --stage every configuration is listed)\n");
        return 2;
    }
    int rc;
    if (stage < 0) {
        rc = zs_estimate_print_table(params, gpus, nodes, stdout, &err);
    } else {
        zs_estimate_t e;
        rc = zs_estimate(params, gpus, nodes, stage, oo, op, &e, &err);
        if (rc == ZS_OK)
            zs_estimate_print(&e, stdout);
    }
    if (rc != ZS_OK) {
        fprintf(stderr, "zs-ctl estimate: %s\n", err.msg);
        return 2;
    }
    if (nshape)
        zs_estimate_print_act(&act, stdout);
    return 0;
}
