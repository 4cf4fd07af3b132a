/*
 * zs_metrics.c - the metrics registry, its text rendering (Prometheus
 * exposition format 0.0.4) and the HTTP endpoint (see zs_metrics.h).
 *
 * A series keeps its double as the bits of an _Atomic uint64_t: set is one
 * atomic store, add a compare-and-swap loop, so hot paths that hold a
 * series pointer never lock. The lists of families and series only grow,
 * under the registry mutex; render walks them under the same mutex.
 *
 * The endpoint is a libmicrohttpd daemon with its own polling thread
 * (poll/epoll, so descriptors above FD_SETSIZE in a busy process are fine),
 * at most 32 connections, 10 s idle timeout. GET or HEAD /metrics renders
 * the registry; another method on /metrics is 405, any other path 404.
 */
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "zs_log.h"
#include "zs_metrics.h"
#include "zs_file.h"

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct zs_metric_series {
    struct zs_metric_series *next;
    _Atomic uint64_t bits; /* the value's IEEE-754 bits */
    char *values[ZS_METRICS_MAX_LABELS];
};

struct zs_metric {
    zs_metrics_t *reg;
    struct zs_metric *next;
    char name[ZS_METRICS_NAME_MAX];
    char labels[ZS_METRICS_MAX_LABELS][ZS_METRICS_NAME_MAX];
    int nlabels;
    zs_metric_type_t type;
    char *help;
    zs_series_t *head, **tail;
};

struct zs_metrics {
    pthread_mutex_t mu; /* the lists, the scrape function */
    zs_metric_t *head, **tail;
    void (*scrape)(void *ud);
    void *scrape_ud;
    /* process metrics (zs_metrics_add_process) */
    zs_series_t *p_start, *p_uptime, *p_rss;
    struct timespec t0; /* CLOCK_MONOTONIC at zs_metrics_add_process */
    /* endpoint */
    struct MHD_Daemon *daemon;
    char host[256];
    int port;
};

/* ---- values --------------------------------------------------------------- */

static uint64_t d2u(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double u2d(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

void zs_series_set(zs_series_t *s, double v)
{
    atomic_store_explicit(&s->bits, d2u(v), memory_order_relaxed);
}

void zs_series_add(zs_series_t *s, double v)
{
    uint64_t old = atomic_load_explicit(&s->bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&s->bits, &old, d2u(u2d(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

double zs_series_get(const zs_series_t *s)
{
    return u2d(atomic_load_explicit((_Atomic uint64_t *)&s->bits, memory_order_relaxed));
}

/* ---- registry ------------------------------------------------------------- */

int zs_metrics_create(zs_metrics_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->mu, NULL);
    m->tail = &m->head;
    *out = m;
    return ZS_OK;
}

static void series_free(zs_series_t *s, int nlabels)
{
    for (int i = 0; i < nlabels; i++)
        free(s->values[i]);
    free(s);
}

void zs_metrics_destroy(zs_metrics_t *m)
{
    if (!m)
        return;
    if (m->daemon)
        MHD_stop_daemon(m->daemon); /* joins its thread: no render runs after this */
    for (zs_metric_t *f = m->head, *fn; f; f = fn) {
        fn = f->next;
        for (zs_series_t *s = f->head, *sn; s; s = sn) {
            sn = s->next;
            series_free(s, f->nlabels);
        }
        free(f->help);
        free(f);
    }
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Prometheus' name grammar: [a-zA-Z_:][a-zA-Z0-9_:]* for metrics (colon
 * allowed), [a-zA-Z_][a-zA-Z0-9_]* for labels. */
static int name_ok(const char *s, int colon)
{
    size_t n = strlen(s);
    if (n == 0 || n >= ZS_METRICS_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int zs_metrics_add(zs_metrics_t *m, const char *name, zs_metric_type_t type, const char *help,
                   int nlabels, const char *const *labels, zs_metric_t **out, zs_err_t *err)
{
    if (out)
        *out = NULL;
    if (!name || !name_ok(name, 1))
        return zs_err_set(err, ZS_ERR_INVALID, "metric name '%s' is not [a-zA-Z_:][a-zA-Z0-9_:]*",
                          name ? name : "(null)");
    if (type != ZS_METRIC_COUNTER && type != ZS_METRIC_GAUGE)
        return zs_err_set(err, ZS_ERR_INVALID, "metric %s: unknown type %d", name, (int)type);
    if (type == ZS_METRIC_COUNTER && !ends_with(name, "_total"))
        return zs_err_set(err, ZS_ERR_INVALID, "counter %s: counter names end in _total", name);
    if (nlabels < 0 || nlabels > ZS_METRICS_MAX_LABELS || (nlabels && !labels))
        return zs_err_set(err, ZS_ERR_INVALID, "metric %s: %d labels (0..%d)", name, nlabels,
                          ZS_METRICS_MAX_LABELS);
    for (int i = 0; i < nlabels; i++) {
        if (!labels[i] || !name_ok(labels[i], 0) || strncmp(labels[i], "__", 2) == 0)
            return zs_err_set(err, ZS_ERR_INVALID,
                              "metric %s: label name '%s' is not [a-zA-Z_][a-zA-Z0-9_]* or "
                              "starts with __ (reserved)",
                              name, labels[i] ? labels[i] : "(null)");
        for (int j = 0; j < i; j++)
            if (strcmp(labels[i], labels[j]) == 0)
                return zs_err_set(err, ZS_ERR_INVALID, "metric %s: label %s given twice", name,
                                  labels[i]);
    }
    zs_metric_t *f = calloc(1, sizeof *f);
    char *h = strdup(help ? help : "");
    if (!f || !h) {
        free(f);
        free(h);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    f->reg = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    for (int i = 0; i < nlabels; i++)
        snprintf(f->labels[i], sizeof f->labels[i], "%s", labels[i]);
    f->nlabels = nlabels;
    f->type = type;
    f->help = h;
    f->tail = &f->head;
    pthread_mutex_lock(&m->mu);
    for (zs_metric_t *g = m->head; g; g = g->next) {
        if (strcmp(g->name, name) == 0) {
            pthread_mutex_unlock(&m->mu);
            free(h);
            free(f);
            return zs_err_set(err, ZS_ERR_EXISTS, "metric %s is already registered", name);
        }
    }
    *m->tail = f;
    m->tail = &f->next;
    pthread_mutex_unlock(&m->mu);
    if (out)
        *out = f;
    return ZS_OK;
}

zs_series_t *zs_metric_series(zs_metric_t *f, const char *const *values)
{
    zs_metrics_t *m = f->reg;
    pthread_mutex_lock(&m->mu);
    zs_series_t *s;
    for (s = f->head; s; s = s->next) {
        int i = 0;
        while (i < f->nlabels && strcmp(s->values[i], values[i] ? values[i] : "") == 0)
            i++;
        if (i == f->nlabels)
            break;
    }
    if (!s && (s = calloc(1, sizeof *s)) != NULL) {
        int ok = 1;
        for (int i = 0; i < f->nlabels; i++)
            ok &= (s->values[i] = strdup(values[i] ? values[i] : "")) != NULL;
        if (!ok) {
            series_free(s, f->nlabels);
            s = NULL;
        } else {
            atomic_init(&s->bits, d2u(0.0));
            *f->tail = s;
            f->tail = &s->next;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return s;
}

int zs_metric_set(zs_metric_t *f, const char *const *values, double v)
{
    zs_series_t *s = zs_metric_series(f, values);
    if (!s)
        return ZS_ERR_NOMEM;
    zs_series_set(s, v);
    return ZS_OK;
}

void zs_metrics_on_scrape(zs_metrics_t *m, void (*fn)(void *ud), void *ud)
{
    pthread_mutex_lock(&m->mu);
    m->scrape = fn;
    m->scrape_ud = ud;
    pthread_mutex_unlock(&m->mu);
}

/* ---- process metrics ------------------------------------------------------ */

int zs_metrics_add_process(zs_metrics_t *m, const char *prefix, zs_err_t *err)
{
    char n1[ZS_METRICS_NAME_MAX], n2[ZS_METRICS_NAME_MAX], n3[ZS_METRICS_NAME_MAX];
    snprintf(n1, sizeof n1, "%s_start_time_seconds", prefix);
    snprintf(n2, sizeof n2, "%s_uptime_seconds", prefix);
    snprintf(n3, sizeof n3, "%s_resident_memory_bytes", prefix);
    zs_metric_t *f1, *f2, *f3;
    int rc = zs_metrics_add(m, n1, ZS_METRIC_GAUGE,
                            "Start time of the process since the Unix "
                            "epoch in seconds.",
                            0, NULL, &f1, err);
    if (!rc)
        rc = zs_metrics_add(m, n2, ZS_METRIC_GAUGE, "Seconds since the process started.", 0, NULL,
                            &f2, err);
    if (!rc)
        rc = zs_metrics_add(m, n3, ZS_METRIC_GAUGE,
                            "Resident set size of the process in bytes (/proc/self/statm).", 0,
                            NULL, &f3, err);
    if (rc)
        return rc;
    zs_series_t *s1 = zs_metric_series(f1, NULL), *s2 = zs_metric_series(f2, NULL),
                *s3 = zs_metric_series(f3, NULL);
    if (!s1 || !s2 || !s3)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    zs_series_set(s1, (double)now.tv_sec + 1e-9 * (double)now.tv_nsec);
    pthread_mutex_lock(&m->mu);
    clock_gettime(CLOCK_MONOTONIC, &m->t0);
    m->p_start = s1;
    m->p_uptime = s2;
    m->p_rss = s3;
    pthread_mutex_unlock(&m->mu);
    return ZS_OK;
}

/* ---- rendering ------------------------------------------------------------ */

typedef struct buf {
    char *p;
    size_t n, cap;
    int oom;
} buf_t;

static void put(buf_t *b, const char *s, size_t k)
{
    if (b->oom)
        return;
    if (b->n + k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->n + k + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = '\0';
}

static void puts_(buf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Append s escaped: backslash and newline always ("\\", "\n"); the double
 * quote too in label values ("\""), as the format requires. */
static void put_escaped(buf_t *b, const char *s, int quote)
{
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            put(b, "\\\\", 2);
        else if (*p == '\n')
            put(b, "\\n", 2);
        else if (quote && *p == '"')
            put(b, "\\\"", 2);
        else
            put(b, p, 1);
    }
}

/* The shortest decimal that reads back as v; +Inf, -Inf, NaN as Prometheus
 * spells them. */
static void fmt_value(double v, char *out, size_t cap)
{
    if (isnan(v)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

int zs_metrics_render(zs_metrics_t *m, char **text, size_t *len, zs_err_t *err)
{
    *text = NULL;
    *len = 0;
    pthread_mutex_lock(&m->mu);
    void (*fn)(void *) = m->scrape;
    void *ud = m->scrape_ud;
    if (m->p_uptime) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        zs_series_set(m->p_uptime, (double)(now.tv_sec - m->t0.tv_sec) +
                                       1e-9 * (double)(now.tv_nsec - m->t0.tv_nsec));
        zs_series_set(m->p_rss, (double)zs_file_self_rss());
    }
    pthread_mutex_unlock(&m->mu);
    if (fn)
        fn(ud);

    buf_t b = {0};
    char num[64];
    pthread_mutex_lock(&m->mu);
    for (zs_metric_t *f = m->head; f; f = f->next) {
        puts_(&b, "# HELP ");
        puts_(&b, f->name);
        puts_(&b, " ");
        put_escaped(&b, f->help, 0);
        puts_(&b, "\n# TYPE ");
        puts_(&b, f->name);
        puts_(&b, f->type == ZS_METRIC_COUNTER ? " counter\n" : " gauge\n");
        for (zs_series_t *s = f->head; s; s = s->next) {
            puts_(&b, f->name);
            for (int i = 0; i < f->nlabels; i++) {
                puts_(&b, i ? "," : "{");
                puts_(&b, f->labels[i]);
                puts_(&b, "=\"");
                put_escaped(&b, s->values[i], 1);
                puts_(&b, "\"");
            }
            if (f->nlabels)
                puts_(&b, "}");
            fmt_value(zs_series_get(s), num, sizeof num);
            puts_(&b, " ");
            puts_(&b, num);
            puts_(&b, "\n");
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (!b.p && !b.oom)
        puts_(&b, ""); /* an empty registry renders as "" */
    if (b.oom) {
        free(b.p);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory rendering metrics");
    }
    *text = b.p;
    *len = b.n;
    return ZS_OK;
}

/* ---- HTTP endpoint -------------------------------------------------------- */

static enum MHD_Result respond(struct MHD_Connection *c, unsigned code, const char *body,
                               const char *allow)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls)
{
    zs_metrics_t *m = cls;
    if (strcmp(url, "/metrics") != 0)
        return respond(c, MHD_HTTP_NOT_FOUND, "not found: this endpoint serves GET /metrics\n",
                       NULL);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n",
                       "GET, HEAD");
    char *text;
    size_t len;
    zs_err_t err;
    if (zs_metrics_render(m, &text, &len, &err))
        return respond(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot render metrics\n", NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    ZS_WARN("metrics endpoint: %s", line);
}

/* "HOST:PORT" or "[V6]:PORT" into host and port strings. */
static int split_hostport(const char *hp, char *host, size_t hcap, char *port, size_t pcap,
                          zs_err_t *err)
{
    const char *colon, *h = hp, *he;
    if (hp[0] == '[') {
        he = strchr(hp, ']');
        if (!he || he[1] != ':')
            return zs_err_set(err, ZS_ERR_INVALID, "metrics address %s: use [IPv6]:PORT", hp);
        h = hp + 1;
        colon = he + 1;
    } else {
        colon = strrchr(hp, ':');
        if (!colon || memchr(hp, ':', (size_t)(colon - hp)))
            return zs_err_set(err, ZS_ERR_INVALID,
                              "metrics address %s: use HOST:PORT (IPv6 in brackets)", hp);
        he = colon;
    }
    const char *p = colon + 1;
    size_t plen = strlen(p), hlen = (size_t)(he - h);
    int digits = plen > 0 && plen <= 5 && strspn(p, "0123456789") == plen;
    if (hlen == 0 || hlen >= hcap || !digits || atoi(p) > 65535 || plen >= pcap)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "metrics address %s: use HOST:PORT with a port 0..65535 (0: any free)",
                          hp);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    memcpy(port, p, plen + 1);
    return ZS_OK;
}

int zs_metrics_serve(zs_metrics_t *m, const char *hostport, zs_err_t *err)
{
    if (m->daemon)
        return zs_err_set(err, ZS_ERR_STATE, "metrics endpoint already serving");
    char host[256], port[8];
    int rc = split_hostport(hostport, host, sizeof host, port, sizeof port, err);
    if (rc)
        return rc;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0 || !ai)
        return zs_err_set(err, ZS_ERR_INVALID, "metrics address %s: %s", hostport,
                          gai ? gai_strerror(gai) : "no address");
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    errno = 0;
    /* the logger goes first so MHD prints nothing of its own */
    struct MHD_Daemon *d =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
                         NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)32, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    int e = errno;
    freeaddrinfo(ai);
    if (!d)
        return zs_err_set(err, ZS_ERR_UNAVAILABLE, "cannot serve metrics on %s: %s", hostport,
                          e ? strerror(e) : "libmicrohttpd could not start");
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : atoi(port);
    /* keep an IPv6 address in brackets, "[::1]", so HOST:PORT stays parseable */
    snprintf(m->host, sizeof m->host, hostport[0] == '[' ? "[%s]" : "%s", host);
    m->daemon = d;
    return ZS_OK;
}

void zs_metrics_address(const zs_metrics_t *m, char *buf, size_t cap)
{
    if (!m->daemon)
        snprintf(buf, cap, "%s", "");
    else
        snprintf(buf, cap, "%s:%d", m->host, m->port);
}

int zs_metrics_write_address(const zs_metrics_t *m, const char *path, zs_err_t *err)
{
    char addr[300], tmp[4096];
    zs_metrics_address(m, addr, sizeof addr);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return zs_err_set(err, ZS_ERR_INVALID, "path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    int ok = f && fprintf(f, "%s\n", addr) >= 0;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return zs_err_set(err, ZS_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    return ZS_OK;
}
