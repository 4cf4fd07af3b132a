/*
 * zs_server_main.c - the zs-server command: flags, signals, start and
 * graceful stop of one shard server.
 *
 * Startup: open the data dir (loading the newest complete checkpoint), bind,
 * serve. SIGTERM/SIGINT: stop accepting, wake waiting pulls, let in-flight
 * handlers (a checkpoint being written included) finish, close the DB.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <sched.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_budget.h"
#include "zs_file.h"
#include "zs_log.h"
#include "zs_rpc.h"
#include "zs_server_metrics.h"
#include "zs_service.h"
#include "zs_shard.h"
#include "zs_shm_sessions.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zs-server --listen HOST:PORT --data DIR [options]\n"
            "\n"
            "Shard server of zeroshard: holds fp32 master weights and AdamW state for its\n"
            "range of the flat parameter space, runs the optimizer on commit, and keeps\n"
            "checkpoints in RocksDB under DIR.\n"
            "\n"
            "  --listen HOST:PORT   address to serve on (port 0: pick a free port), or\n"
            "                       unix:PATH (a Unix socket: workers on this host)\n"
            "  --data DIR           RocksDB directory (created if missing)\n"
            "  --threads N          optimizer threads (default: all CPUs, or those of --cpus)\n"
            "  --cpus LIST          run on these CPUs only, e.g. 2-7,10 (like DeepSpeed's\n"
            "                       --bind_cores_to_rank or taskset; default: all allowed)\n"
            "  --keep K             checkpoints kept after each new one (default 2)\n"
            "  --token-file F       require 'authorization: Bearer <token>' (token read from F)\n"
            "  --tls-cert F         serve TLS with this PEM certificate chain\n"
            "  --tls-key F          and this PEM private key\n"
            "  --max-calls N        concurrent calls before RESOURCE_EXHAUSTED (default 64)\n"
            "  --mem-budget SIZE    memory that requests may make the server allocate\n"
            "                       (state, Initialize/Restore, SetState/Pull buffers), e.g.\n"
            "                       64G; beyond it RESOURCE_EXHAUSTED (default: 80%% of RAM\n"
            "                       or of the cgroup limit)\n"
            "  --spec-window SIZE   pre-images kept for speculative updates (12 B/element,\n"
            "                       reserved against --mem-budget): beyond it chunks wait\n"
            "                       for Commit; 0 or off: no speculation (default 1G)\n"
            "  --nvme-path DIR      keep fp32 master weights, Adam moments and the staged\n"
            "                       gradients in a tile file under DIR (an NVMe drive;\n"
            "                       O_DIRECT, io_uring) instead of RAM: RAM holds the\n"
            "                       16-bit copy (2 B/element) and the I/O buffers; one\n"
            "                       server per DIR;\n"
            "                       speculation's pre-images on the drive (docs/nvme.md)\n"
            "  --nvme-buffered      allow DIR without O_DIRECT (tmpfs, some network file\n"
            "                       systems): through the page cache, outside the budget\n"
            "  --nvme-buffers N     tiles (1 MiB each with their gradients) in flight in an\n"
            "                       update (default 16)\n"
            "  --protocol-version V speak protocol versions up to V only (1 or 2; default\n"
            "                       2): 1 behaves as a server before speculative updates\n"
            "                       (compatibility and tests of newer clients)\n"
            "  --ready-file F       write the bound HOST:PORT (or unix:PATH) to F once serving\n"
            "  --metrics HOST:PORT  serve Prometheus metrics on http://HOST:PORT/metrics\n"
            "                       (port 0: a free one; docs/metrics.md; default: off)\n"
            "  --metrics-ready-file F  write the metrics endpoint's bound HOST:PORT to F\n"
            "  --shm-socket PATH|auto|off  Unix socket where workers on this host hand over\n"
            "                       shared staging memory (bulk bytes bypass TCP); auto\n"
            "                       (default): DIR/shm.sock, or TCP only if it cannot be made\n"
            "  --help               this text\n"
            "\n"
            "Environment: ZS_LOG_LEVEL=debug|info|warn|error (default info), ZS_TOKEN\n"
            "(bearer token, instead of --token-file). A token is printable ASCII without\n"
            "spaces; an empty or blank one is refused (exit 2), never taken as 'no token'.\n");
}

/* Parse a CPU list ("0-3,8,10-11": ascending or not, no blanks) into *set.
 * Returns NULL on success, else what is wrong. Every CPU must be one this
 * process may run on (sched_getaffinity), so a typo fails at start instead
 * of silently running elsewhere. */
static const char *parse_cpus(const char *s, cpu_set_t *set)
{
    static char why[96];
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return "cannot read this process's CPU affinity";
    CPU_ZERO(set);
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0)
            return "expected a CPU number";
        p = end;
        if (*p == '-') {
            b = strtol(++p, &end, 10);
            if (end == p || b < a)
                return "expected a range A-B with A <= B";
            p = end;
        }
        if (*p == ',')
            p++;
        else if (*p)
            return "expected ',' between CPUs";
        for (long c = a; c <= b; c++) {
            if (c >= CPU_SETSIZE || !CPU_ISSET((int)c, &allowed)) {
                snprintf(why, sizeof why, "CPU %ld is not one this process may run on", c);
                return why;
            }
            CPU_SET((int)c, set);
        }
    }
    return CPU_COUNT(set) ? NULL : "empty list";
}

/* A bearer token must be 1..4096 bytes a client can send in a header value
 * without escaping: printable ASCII, no spaces (RFC 6750's b64token is a
 * subset). Returns NULL if `t` is such a token, else what is wrong with it. */
static const char *token_problem(const char *t)
{
    if (!t[0])
        return "it is empty (or only blanks)";
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return "it holds a character other than printable ASCII (a space, tab, control or "
                   "non-ASCII byte)";
    return NULL;
}

/* Drop trailing blanks (spaces, tabs, CR, LF) in place. */
static void trim_right(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        n--;
    s[n] = '\0';
}

/* Memory glibc keeps free is given back once it exceeds this (bytes). */
#define TRIM_ABOVE (64ull << 20)

/* Give memory the allocator keeps free back to the system when there is
 * more than TRIM_ABOVE of it. Why: measured with tests/test_server_load.c,
 * a fuzz-like run and 64 concurrent clients left the RSS 235 MiB above its
 * baseline while the heap in use was unchanged (-2 MiB): glibc retains freed
 * blocks in its per-thread arenas (up to 8 per core), each keeping up to
 * M_TRIM_THRESHOLD (64 MiB, raised by zs_frame_parse for push speed) at its
 * top. It is retention, not a leak (LeakSanitizer finds none after the same
 * run). malloc_trim gives back the free pages inside every arena and the
 * main arena's top (not the other arenas' tops: cap_arenas bounds those).
 * Checked every second by main; it takes well under a millisecond here. */
static void trim_if_retaining(void)
{
    struct mallinfo2 mi = mallinfo2();
    if ((uint64_t)mi.fordblks <= TRIM_ABOVE)
        return;
    malloc_trim(0);
    struct mallinfo2 after = mallinfo2();
    ZS_DEBUG("malloc_trim: heap kept free %.1f -> %.1f MiB (in use %.1f MiB)",
             (double)mi.fordblks / (1 << 20), (double)after.fordblks / (1 << 20),
             (double)(after.uordblks + after.hblkhd) / (1 << 20));
}

/* Cap glibc's malloc arenas (default 8 per core) at 2 + cores/8, at most 8,
 * unless MALLOC_ARENA_MAX says otherwise. Why: malloc_trim cannot shrink the
 * top of an arena other than the main one, and each may keep up to
 * M_TRIM_THRESHOLD (64 MiB) there. Measured with tests/test_server_load.c on
 * 2 cores: RSS after the run +168 MiB with glibc's default, +32 MiB with 2
 * arenas (+23 with 1, +43 with 4), at the same call and step rates. Must run
 * before any other thread starts. */
static void cap_arenas(void)
{
    if (getenv("MALLOC_ARENA_MAX"))
        return;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int arenas = 2 + (int)(ncpu > 0 ? ncpu / 8 : 0);
    mallopt(M_ARENA_MAX, arenas < 8 ? arenas : 8);
}

/* mkdir -p: create `path` and its missing parents (mode 0755). */
static int mkdir_p(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* One line of what this server did since it started, at shutdown: the
 * optimizer's passes (time per applied step, and their state traffic per
 * second at AdamW's 28 B/element), speculation and checkpoints. For a
 * benchmark's log; the same totals are on --metrics while it runs. */
static void log_totals(zs_shard_t *sh)
{
    zs_shard_info_t in;
    zs_err_t err;
    if (zs_shard_info(sh, &in, &err) != ZS_OK)
        return;
    const zs_shard_counters_t *c = &in.counters;
    uint64_t n = c->steps_applied ? c->steps_applied : 1;
    ZS_INFO("totals: %llu steps applied (%llu skipped); optimizer passes %.3f s (%.1f ms per step, "
            "%.1f GB/s of state); speculation %llu kept / %llu rolled back, %.3f s over %llu "
            "elements; %llu checkpoints in %.3f s",
            (unsigned long long)c->steps_applied, (unsigned long long)c->steps_skipped,
            c->optimizer_seconds, 1e3 * c->optimizer_seconds / (double)n,
            c->optimizer_seconds > 0 ? (double)c->optimizer_bytes / c->optimizer_seconds / 1e9
                                     : 0.0,
            (unsigned long long)c->spec_hits, (unsigned long long)c->spec_rollbacks,
            c->spec_seconds, (unsigned long long)c->spec_elements,
            (unsigned long long)c->checkpoints_written, c->checkpoint_seconds);
    free(in.checkpoints);
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *data = NULL, *token_file = NULL, *cert = NULL, *key = NULL,
               *ready = NULL, *metrics = NULL, *metrics_ready = NULL, *cpus = NULL;
    cap_arenas();
    int threads = 0, keep = 2, max_calls = 64;
    uint64_t mem_budget = 0, spec_window = ZS_SPEC_WINDOW_DEFAULT;
    long version = ZS_PROTOCOL_VERSION;
    const char *shm_flag = NULL; /* --shm-socket; NULL: auto */
    const char *nvme_path = NULL;
    int nvme_buffered = 0, nvme_depth = 0;
    static const struct option opts[] = {{"listen", required_argument, 0, 'l'},
                                         {"data", required_argument, 0, 'd'},
                                         {"threads", required_argument, 0, 't'},
                                         {"cpus", required_argument, 0, 'C'},
                                         {"keep", required_argument, 0, 'k'},
                                         {"token-file", required_argument, 0, 'T'},
                                         {"tls-cert", required_argument, 0, 'c'},
                                         {"tls-key", required_argument, 0, 'K'},
                                         {"max-calls", required_argument, 0, 'm'},
                                         {"ready-file", required_argument, 0, 'r'},
                                         {"mem-budget", required_argument, 0, 'M'},
                                         {"spec-window", required_argument, 0, 'S'},
                                         {"protocol-version", required_argument, 0, 'V'},
                                         {"metrics", required_argument, 0, 'P'},
                                         {"metrics-ready-file", required_argument, 0, 'R'},
                                         {"shm-socket", required_argument, 0, 'U'},
                                         {"nvme-path", required_argument, 0, 'N'},
                                         {"nvme-buffered", no_argument, 0, 'B'},
                                         {"nvme-buffers", required_argument, 0, 'D'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'l':
            listen = optarg;
            break;
        case 'd':
            data = optarg;
            break;
        case 't':
            threads = atoi(optarg);
            break;
        case 'C':
            cpus = optarg;
            break;
        case 'k':
            keep = atoi(optarg);
            break;
        case 'T':
            token_file = optarg;
            break;
        case 'c':
            cert = optarg;
            break;
        case 'K':
            key = optarg;
            break;
        case 'm':
            max_calls = atoi(optarg);
            break;
        case 'r':
            ready = optarg;
            break;
        case 'P':
            metrics = optarg;
            break;
        case 'R':
            metrics_ready = optarg;
            break;
        case 'U':
            shm_flag = optarg;
            break;
        case 'N':
            nvme_path = optarg;
            break;
        case 'B':
            nvme_buffered = 1;
            break;
        case 'D': {
            char *end;
            long d = strtol(optarg, &end, 10);
            if (end == optarg || *end || d < 3 || d > 4096) {
                fprintf(stderr, "zs-server: --nvme-buffers %s: a number of tiles, 3..4096\n",
                        optarg);
                return 2;
            }
            nvme_depth = (int)d;
            break;
        }
        case 'M':
            if (zs_budget_parse(optarg, &mem_budget)) {
                fprintf(stderr, "zs-server: --mem-budget %s: not a size (e.g. 800M, 64G)\n",
                        optarg);
                return 2;
            }
            break;
        case 'S':
            if (strcmp(optarg, "0") == 0 || strcmp(optarg, "off") == 0)
                spec_window = 0;
            else if (zs_budget_parse(optarg, &spec_window)) {
                fprintf(stderr, "zs-server: --spec-window %s: not a size (e.g. 256M, 0, off)\n",
                        optarg);
                return 2;
            }
            break;
        case 'V': {
            char *end;
            version = strtol(optarg, &end, 10);
            if (end == optarg || *end || version < ZS_PROTOCOL_VERSION_MIN ||
                version > ZS_PROTOCOL_VERSION) {
                fprintf(stderr, "zs-server: --protocol-version %s: this server speaks %d..%d\n",
                        optarg, ZS_PROTOCOL_VERSION_MIN, ZS_PROTOCOL_VERSION);
                return 2;
            }
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!listen || !data || optind != argc) {
        fprintf(stderr, "zs-server: --listen and --data are required\n\n");
        usage(stderr);
        return 2;
    }
    if (keep < 1 || threads < 0 || max_calls < 1) {
        fprintf(stderr, "zs-server: --keep and --max-calls must be >= 1, --threads >= 0\n");
        return 2;
    }
    if (metrics_ready && !metrics) {
        fprintf(stderr, "zs-server: --metrics-ready-file needs --metrics\n");
        return 2;
    }
    if (!!cert != !!key) {
        fprintf(stderr, "zs-server: --tls-cert and --tls-key go together\n");
        return 2;
    }
    /* --cpus: the whole process (optimizer threads, gRPC, checkpoints) on
     * those CPUs, set before any thread starts so that every one inherits
     * it; the optimizer gets one thread per listed CPU unless --threads. */
    if (cpus) {
        cpu_set_t set;
        const char *why = parse_cpus(cpus, &set);
        if (why) {
            fprintf(stderr, "zs-server: --cpus %s: %s\n", cpus, why);
            return 2;
        }
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            fprintf(stderr, "zs-server: --cpus %s: %s\n", cpus, strerror(errno));
            return 1;
        }
        if (!threads)
            threads = CPU_COUNT(&set);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "zs-server[%s]", listen);
    zs_log_set_tag(tag);

    char *token = NULL, *cert_pem = NULL, *key_pem = NULL;
    const char *token_src = token_file ? token_file : "ZS_TOKEN";
    if (token_file) {
        if (!(token = zs_file_read_text(token_file, 4096, 1))) {
            fprintf(stderr, "zs-server: cannot read --token-file %s\n", token_file);
            return 1;
        }
    } else if (getenv("ZS_TOKEN")) {
        token = strdup(getenv("ZS_TOKEN"));
    }
    /* A token that was asked for but is empty would switch authentication
     * off while the log says "token required": refuse to start instead. */
    if (token) {
        trim_right(token);
        const char *why = token_problem(token);
        if (why) {
            fprintf(stderr,
                    "zs-server: the bearer token from %s cannot be used: %s. Write the token "
                    "(printable ASCII, no spaces) or leave authentication off.\n",
                    token_src, why);
            free(token);
            return 2;
        }
    }
    if (cert && (!(cert_pem = zs_file_read_text(cert, 1 << 20, 0)) ||
                 !(key_pem = zs_file_read_text(key, 1 << 20, 0)))) {
        fprintf(stderr, "zs-server: cannot read TLS files %s / %s\n", cert, key);
        return 1;
    }

    /* Signals are taken synchronously by main; block them in every thread. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (mkdir_p(data) != 0) {
        fprintf(stderr, "zs-server: cannot create data dir %s: %s\n", data, strerror(errno));
        return 1;
    }
    grpc_init();
    zs_err_t err;
    zs_err_clear(&err);
    zs_shard_t *sh;
    uint64_t ram = 0, dflt = zs_budget_default(&ram);
    if (!mem_budget)
        mem_budget = dflt;
    if (cpus)
        ZS_INFO("running on CPUs %s (--cpus), %d optimizer threads", cpus, threads);
    ZS_INFO("memory budget %.2f GiB%s (RAM or cgroup limit %.2f GiB)",
            (double)mem_budget / (1 << 30), mem_budget == dflt ? " (80%)" : "",
            (double)ram / (1 << 30));
    zs_service_set_protocol_version((uint32_t)version, NULL); /* in range: checked above */
    if (version < ZS_PROTOCOL_V_SPECULATION) {
        /* No client of this version states an expectation: no pre-images. */
        spec_window = 0;
        ZS_INFO("speaking protocol version %ld at most (--protocol-version): no speculative "
                "updates",
                version);
    }
    if ((nvme_buffered || nvme_depth) && !nvme_path) {
        fprintf(stderr, "zs-server: --nvme-buffered and --nvme-buffers need --nvme-path\n");
        grpc_shutdown();
        return 2;
    }
    zs_shard_opts_t so = {data,        threads,   keep,          listen,    mem_budget,
                          spec_window, nvme_path, nvme_buffered, nvme_depth};
    if (zs_shard_create(&so, &sh, &err)) {
        ZS_ERROR("cannot start: %s", err.msg);
        grpc_shutdown();
        return 1;
    }
    /* After the store (it locks the data dir), before serving (Hello names
     * the socket from the first call); segments mapped up to the budget. */
    zs_shm_sessions_t *shm = NULL;
    if (zs_shm_sessions_open(shm_flag, data, token,
                             mem_budget < ZS_SHM_SESSIONS_MAX_MAP ? mem_budget
                                                                  : ZS_SHM_SESSIONS_MAX_MAP,
                             &shm, &err)) {
        ZS_ERROR("cannot start: %s", err.msg);
        zs_shard_destroy(sh);
        grpc_shutdown();
        return 2;
    }
    zs_service_set_shm(shm);
    int nm;
    const zs_rpc_method_t *methods = zs_service_methods(&nm);
    zs_rpc_server_opts_t ro = {listen, token, cert_pem, key_pem, max_calls, (uint32_t)version};
    zs_rpc_server_t *srv;
    if (zs_rpc_server_create(&ro, methods, nm, sh, &srv, &err)) {
        ZS_ERROR("cannot start: %s", err.msg);
        zs_service_set_shm(NULL);
        zs_shm_sessions_stop(shm);
        zs_shard_destroy(sh);
        grpc_shutdown();
        return 1;
    }
    int port = zs_rpc_server_port(srv);
    char bound[256];
    snprintf(bound, sizeof bound, "%s", listen);
    /* HOST:0 becomes HOST:PORT; a Unix socket (unix:PATH, unix-abstract:NAME)
     * is its own address (gRPC reports port 1 for it) */
    char *colon = strncmp(listen, "unix", 4) ? strrchr(bound, ':') : NULL;
    if (colon)
        snprintf(colon + 1, sizeof bound - (size_t)(colon + 1 - bound), "%d", port);
    ZS_INFO("serving on %s (data %s, %s%s)", bound, data, cert ? "TLS" : "plaintext",
            token ? ", token required" : "");
    zs_server_metrics_t *sm = NULL;
    if (metrics) { /* asked for and not possible: refuse to run without it */
        if (zs_server_metrics_create(metrics, sh, srv, methods, nm, bound, &sm, &err) ||
            (metrics_ready &&
             zs_metrics_write_address(zs_server_metrics_registry(sm), metrics_ready, &err))) {
            ZS_ERROR("--metrics: %s", err.msg);
            zs_server_metrics_destroy(sm);
            zs_shard_shutdown(sh);
            zs_rpc_server_destroy(srv);
            zs_service_set_shm(NULL);
            zs_shm_sessions_stop(shm);
            zs_shard_destroy(sh);
            grpc_shutdown();
            return 1;
        }
        char maddr[300];
        zs_metrics_address(zs_server_metrics_registry(sm), maddr, sizeof maddr);
        ZS_INFO("metrics on http://%s/metrics", maddr);
    }
    if (ready) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", ready);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", bound) < 0 || fclose(f) != 0 || rename(tmp, ready) != 0)
            ZS_ERROR("cannot write --ready-file %s", ready);
    }

    int sig;
    for (;;) { /* wait for SIGINT/SIGTERM; once a second, trim retained heap */
        struct timespec tick = {1, 0};
        sig = sigtimedwait(&set, NULL, &tick);
        if (sig > 0)
            break;
        trim_if_retaining();
    }
    ZS_INFO("signal %d: shutting down", sig);
    log_totals(sh);
    zs_server_metrics_destroy(sm);
    zs_shard_shutdown(sh);
    zs_rpc_server_destroy(srv);
    zs_service_set_shm(NULL); /* no handler runs now */
    zs_shm_sessions_stop(shm);
    zs_shard_destroy(sh);
    grpc_shutdown();
    ZS_INFO("stopped");
    free(token);
    free(cert_pem);
    free(key_pem);
    return 0;
}
