/*
 * test_metrics.c - the metrics registry and its endpoint (common/zs_metrics.c).
 *
 * Checks: names and labels are held to Prometheus' grammar and conventions
 * at registration (counters end in _total, no "__" labels, no duplicates);
 * the exposition text is exactly format 0.0.4 for a known registry (HELP
 * and TYPE lines, label values with backslash, quote and newline escaped,
 * help text escaped, +Inf/-Inf/NaN, shortest round-trip numbers); every
 * sample line parses back, label values unescaped, to what was set;
 * concurrent adds lose nothing; and over a real HTTP GET on 127.0.0.1 (a
 * bare socket client, HTTP/1.1) /metrics answers 200 with the 0.0.4
 * content type and the rendered text, HEAD answers with no body, other paths
 * 404, other methods 405, and the scrape function runs once per GET. The
 * bound address file names the port; a taken port and malformed addresses
 * are refused.
 */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "zs_file.h"
#include "zs_metrics.h"
#include "zs_proc.h"
#include "zs_test.h"

/* ---- a bare HTTP client --------------------------------------------------- */

typedef struct {
    int status;
    char headers[2048];
    char *body; /* malloc'd, NUL-terminated */
    size_t body_len;
} http_reply_t;

/* One request over a fresh connection (Connection: close); reads to EOF.
 * Returns 0, or -1 if the connection or the reply failed. */
static int http(int port, const char *method, const char *path, http_reply_t *r)
{
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
                     "Content-Length: 0\r\n\r\n",
                     method, path, port);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = '\0';
    char *end = strstr(buf, "\r\n\r\n");
    if (!end || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return -1;
    }
    size_t hl = (size_t)(end - buf);
    snprintf(r->headers, sizeof r->headers, "%.*s", (int)hl, buf);
    r->body_len = len - hl - 4;
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, end + 4, r->body_len + 1);
    free(buf);
    return 0;
}

/* ---- a parser of sample lines --------------------------------------------- */

/* Find the sample of `name` whose labels equal want[0..n) (name=value
 * pairs, unescaped) in exposition text; returns its value, or NAN with
 * *found = 0. Fails the test on a line that does not parse. */
static double sample(const char *text, const char *name, int n, const char *const (*want)[2],
                     int *found)
{
    *found = 0;
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        TEST_CHECKF(eol, "last line not terminated: %s", line);
        if (*line == '#') {
            line = eol + 1;
            continue;
        }
        size_t nl = strcspn(line, "{ ");
        int same = nl == strlen(name) && strncmp(line, name, nl) == 0;
        const char *p = line + nl;
        char keys[8][64], vals[8][256];
        int nk = 0;
        if (*p == '{') {
            p++;
            while (*p != '}') {
                size_t kl = strcspn(p, "=");
                TEST_CHECKF(kl < 64 && p[kl] == '=' && p[kl + 1] == '"', "bad label in: %.*s",
                            (int)(eol - line), line);
                memcpy(keys[nk], p, kl);
                keys[nk][kl] = '\0';
                p += kl + 2;
                size_t vl = 0;
                while (*p != '"') {
                    TEST_CHECKF(p < eol, "unterminated label value in: %.*s", (int)(eol - line),
                                line);
                    char c = *p++;
                    if (c == '\\') {
                        char e = *p++;
                        TEST_CHECKF(e == '\\' || e == '"' || e == 'n', "bad escape \\%c", e);
                        c = e == 'n' ? '\n' : e;
                    }
                    vals[nk][vl++] = c;
                }
                vals[nk++][vl] = '\0';
                p++;
                if (*p == ',')
                    p++;
            }
            p++;
        }
        TEST_CHECKF(*p == ' ', "no space before the value in: %.*s", (int)(eol - line), line);
        char *vend;
        double v = strtod(p + 1, &vend);
        TEST_CHECKF(vend == eol, "bad value in: %.*s", (int)(eol - line), line);
        if (same && nk == n) {
            int match = 1;
            for (int i = 0; i < n; i++)
                match &= !strcmp(keys[i], want[i][0]) && !strcmp(vals[i], want[i][1]);
            if (match) {
                *found = 1;
                return v;
            }
        }
        line = eol + 1;
    }
    return NAN;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_names(void)
{
    zs_metrics_t *m;
    zs_err_t err;
    TEST_OK(zs_metrics_create(&m, &err), err);
    const char *l2[] = {"method", "code"}, *dup[] = {"a", "a"}, *res[] = {"__name"},
               *bad[] = {"1x"}, *five[] = {"a", "b", "c", "d", "e"};
    TEST_OK(zs_metrics_add(m, "zs_calls_total", ZS_METRIC_COUNTER, "Calls.", 2, l2, NULL, &err),
            err);
    TEST_OK(zs_metrics_add(m, "zs:rule_level", ZS_METRIC_GAUGE, "x", 0, NULL, NULL, &err), err);
    struct {
        const char *name;
        zs_metric_type_t type;
        int nl;
        const char *const *l;
        int want;
    } cases[] = {
        {"zs_calls", ZS_METRIC_COUNTER, 0, NULL, ZS_ERR_INVALID}, /* counter without _total */
        {"9zs_x", ZS_METRIC_GAUGE, 0, NULL, ZS_ERR_INVALID},
        {"zs-x", ZS_METRIC_GAUGE, 0, NULL, ZS_ERR_INVALID},
        {"", ZS_METRIC_GAUGE, 0, NULL, ZS_ERR_INVALID},
        {"zs_x", ZS_METRIC_GAUGE, 2, dup, ZS_ERR_INVALID},
        {"zs_x", ZS_METRIC_GAUGE, 1, res, ZS_ERR_INVALID},
        {"zs_x", ZS_METRIC_GAUGE, 1, bad, ZS_ERR_INVALID},
        {"zs_x", ZS_METRIC_GAUGE, 5, five, ZS_ERR_INVALID},
        {"zs_calls_total", ZS_METRIC_COUNTER, 0, NULL, ZS_ERR_EXISTS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = zs_metrics_add(m, cases[i].name, cases[i].type, "h", cases[i].nl, cases[i].l, NULL,
                                &err);
        TEST_CHECKF(rc == cases[i].want, "'%s': got %s, want %s", cases[i].name, zs_status_name(rc),
                    zs_status_name(cases[i].want));
    }
    zs_metrics_destroy(m);
}

/* The exact text of a small registry. */
static void test_exposition(void)
{
    zs_metrics_t *m;
    zs_err_t err;
    TEST_OK(zs_metrics_create(&m, &err), err);
    zs_metric_t *calls, *temp, *empty, *odd;
    const char *l2[] = {"method", "code"}, *l1[] = {"v"};
    TEST_OK(zs_metrics_add(m, "zs_calls_total", ZS_METRIC_COUNTER,
                           "Calls by method and code; a \\ and a\nnewline.", 2, l2, &calls, &err),
            err);
    TEST_OK(zs_metrics_add(m, "zs_step", ZS_METRIC_GAUGE, "The step.", 0, NULL, &temp, &err), err);
    TEST_OK(zs_metrics_add(m, "zs_empty_bytes", ZS_METRIC_GAUGE, "No series yet.", 0, NULL, &empty,
                           &err),
            err);
    TEST_OK(zs_metrics_add(m, "zs_odd", ZS_METRIC_GAUGE, "Odd values.", 1, l1, &odd, &err), err);
    const char *a[] = {"Push", "OK"}, *b[] = {"Pull", "INVALID_ARGUMENT"};
    zs_series_add(zs_metric_series(calls, a), 3);
    zs_series_add(zs_metric_series(calls, b), 1);
    zs_series_add(zs_metric_series(calls, a), 2); /* same series again */
    zs_series_set(zs_metric_series(temp, NULL), 9007199254740991.0);
    const char *q[] = {"a\"b\\c\nd"}, *inf[] = {"inf"}, *ninf[] = {"-inf"}, *nan_[] = {"nan"},
               *tenth[] = {"0.1"}, *tiny[] = {"tiny"}, *utf[] = {"h\xc3\xa9"};
    TEST_OK(zs_metric_set(odd, q, -2.5), err);
    TEST_OK(zs_metric_set(odd, inf, INFINITY), err);
    TEST_OK(zs_metric_set(odd, ninf, -INFINITY), err);
    TEST_OK(zs_metric_set(odd, nan_, NAN), err);
    TEST_OK(zs_metric_set(odd, tenth, 0.1), err);
    TEST_OK(zs_metric_set(odd, tiny, 1.25e-9), err);
    TEST_OK(zs_metric_set(odd, utf, 1), err);
    char *text;
    size_t len;
    TEST_OK(zs_metrics_render(m, &text, &len, &err), err);
    const char *want = "# HELP zs_calls_total Calls by method and code; a \\\\ and a\\nnewline.\n"
                       "# TYPE zs_calls_total counter\n"
                       "zs_calls_total{method=\"Push\",code=\"OK\"} 5\n"
                       "zs_calls_total{method=\"Pull\",code=\"INVALID_ARGUMENT\"} 1\n"
                       "# HELP zs_step The step.\n"
                       "# TYPE zs_step gauge\n"
                       "zs_step 9007199254740991\n"
                       "# HELP zs_empty_bytes No series yet.\n"
                       "# TYPE zs_empty_bytes gauge\n"
                       "# HELP zs_odd Odd values.\n"
                       "# TYPE zs_odd gauge\n"
                       "zs_odd{v=\"a\\\"b\\\\c\\nd\"} -2.5\n"
                       "zs_odd{v=\"inf\"} +Inf\n"
                       "zs_odd{v=\"-inf\"} -Inf\n"
                       "zs_odd{v=\"nan\"} NaN\n"
                       "zs_odd{v=\"0.1\"} 0.1\n"
                       "zs_odd{v=\"tiny\"} 1.25e-09\n"
                       "zs_odd{v=\"h\xc3\xa9\"} 1\n";
    TEST_CHECKF(strcmp(text, want) == 0 && len == strlen(want), "rendered:\n%s\nwanted:\n%s", text,
                want);
    /* the parser reads label values back unescaped */
    int found;
    const char *const kv[][2] = {{"v", "a\"b\\c\nd"}};
    double v = sample(text, "zs_odd", 1, kv, &found);
    TEST_CHECKF(found && v == -2.5, "escaped label value read back: found %d, %g", found, v);
    free(text);
    zs_metrics_destroy(m);
}

typedef struct {
    zs_series_t *s;
    int n;
} adder_t;

static void *adder(void *arg)
{
    adder_t *a = arg;
    for (int i = 0; i < a->n; i++)
        zs_series_add(a->s, 1);
    return NULL;
}

static void test_concurrent_adds(void)
{
    zs_metrics_t *m;
    zs_err_t err;
    zs_metric_t *f;
    TEST_OK(zs_metrics_create(&m, &err), err);
    TEST_OK(zs_metrics_add(m, "zs_n_total", ZS_METRIC_COUNTER, "n", 0, NULL, &f, &err), err);
    adder_t a = {zs_metric_series(f, NULL), 200000};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, adder, &a);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    double got = zs_series_get(a.s);
    printf("concurrent adds: %.0f of %d\n", got, 4 * a.n);
    TEST_CHECK(got == 4.0 * a.n);
    zs_metrics_destroy(m);
}

static int g_scrapes;
static zs_series_t *g_scraped;

static void on_scrape(void *ud)
{
    (void)ud;
    g_scrapes++;
    zs_series_set(g_scraped, g_scrapes);
}

static void test_http(void)
{
    zs_metrics_t *m;
    zs_err_t err;
    TEST_OK(zs_metrics_create(&m, &err), err);
    zs_metric_t *f, *s;
    const char *l[] = {"path"};
    TEST_OK(
        zs_metrics_add(m, "zs_test_requests_total", ZS_METRIC_COUNTER, "Requests.", 1, l, &f, &err),
        err);
    TEST_OK(
        zs_metrics_add(m, "zs_test_scrapes", ZS_METRIC_GAUGE, "Renders so far.", 0, NULL, &s, &err),
        err);
    TEST_OK(zs_metrics_add_process(m, "zs_test", &err), err);
    g_scraped = zs_metric_series(s, NULL);
    zs_metrics_on_scrape(m, on_scrape, NULL);
    const char *v[] = {"/a \"quoted\" path"};
    zs_series_add(zs_metric_series(f, v), 7);

    char addr[300];
    zs_metrics_address(m, addr, sizeof addr);
    TEST_CHECK(addr[0] == '\0'); /* not serving yet */
    TEST_OK(zs_metrics_serve(m, "127.0.0.1:0", &err), err);
    TEST_CHECK(zs_metrics_serve(m, "127.0.0.1:0", &err) == ZS_ERR_STATE);
    const char *dir = zs_test_tmpdir("metrics");
    char path[512];
    snprintf(path, sizeof path, "%s/addr", dir);
    TEST_OK(zs_metrics_write_address(m, path, &err), err);
    char *file = zs_file_read_text(path, 4096, 0);
    int port = 0;
    TEST_CHECKF(file && sscanf(file, "127.0.0.1:%d", &port) == 1 && port > 0, "address file: %s",
                file ? file : "(unreadable)");
    zs_metrics_address(m, addr, sizeof addr);
    printf("serving on %s\n", addr);
    free(file);

    http_reply_t r;
    TEST_CHECK(http(port, "GET", "/metrics", &r) == 0);
    TEST_CHECKF(r.status == 200, "GET /metrics: %d", r.status);
    TEST_CHECKF(strstr(r.headers, "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
                "headers: %s", r.headers);
    int found;
    const char *const want_path[][2] = {{"path", "/a \"quoted\" path"}};
    double got = sample(r.body, "zs_test_requests_total", 1, want_path, &found);
    TEST_CHECKF(found && got == 7, "requests over HTTP: found %d, %g\n%s", found, got, r.body);
    TEST_CHECK(strstr(r.body, "# TYPE zs_test_requests_total counter\n"));
    TEST_CHECK(strstr(r.body, "# HELP zs_test_scrapes Renders so far.\n# TYPE zs_test_scrapes "
                              "gauge\n"));
    double scrapes1 = sample(r.body, "zs_test_scrapes", 0, NULL, &found);
    TEST_CHECK(found && scrapes1 == 1);
    double rss = sample(r.body, "zs_test_resident_memory_bytes", 0, NULL, &found);
    TEST_CHECKF(found && rss > 1e6, "rss %g", rss);
    double start = sample(r.body, "zs_test_start_time_seconds", 0, NULL, &found);
    TEST_CHECKF(found && fabs(start - (double)time(NULL)) < 60, "start %f", start);
    TEST_CHECK(sample(r.body, "zs_test_uptime_seconds", 0, NULL, &found) >= 0 && found);
    free(r.body);

    /* The scrape function runs once per GET, and the body is the render. */
    TEST_CHECK(http(port, "GET", "/metrics", &r) == 0 && r.status == 200);
    TEST_CHECK(sample(r.body, "zs_test_scrapes", 0, NULL, &found) == 2);
    free(r.body);

    TEST_CHECK(http(port, "HEAD", "/metrics", &r) == 0);
    TEST_CHECKF(r.status == 200 && r.body_len == 0, "HEAD: %d, %zu bytes", r.status, r.body_len);
    free(r.body);
    const char *paths[] = {"/", "/metric", "/metrics/x", "/favicon.ico"};
    for (int i = 0; i < 4; i++) {
        TEST_CHECK(http(port, "GET", paths[i], &r) == 0);
        TEST_CHECKF(r.status == 404, "GET %s: %d", paths[i], r.status);
        free(r.body);
    }
    TEST_CHECK(http(port, "POST", "/metrics", &r) == 0);
    TEST_CHECKF(r.status == 405 && strstr(r.headers, "Allow: GET, HEAD"), "POST: %d\n%s", r.status,
                r.headers);
    free(r.body);

    /* A taken port is refused; so are malformed addresses. */
    zs_metrics_t *m2;
    TEST_OK(zs_metrics_create(&m2, &err), err);
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", port);
    int rc = zs_metrics_serve(m2, taken, &err);
    TEST_CHECKF(rc == ZS_ERR_UNAVAILABLE, "second bind of %s: %s", taken, zs_status_name(rc));
    printf("taken port: %s\n", err.msg);
    const char *bad[] = {"127.0.0.1",       "127.0.0.1:",    ":9100",
                         "127.0.0.1:65536", "127.0.0.1:-1",  "::1:9100",
                         "[::1]9100",       "127.0.0.1:12a", "no.such.host.invalid:0"};
    for (int i = 0; i < 9; i++) {
        rc = zs_metrics_serve(m2, bad[i], &err);
        TEST_CHECKF(rc == ZS_ERR_INVALID, "address '%s': %s", bad[i], zs_status_name(rc));
    }
    zs_metrics_destroy(m2);

    zs_metrics_destroy(m);
    /* stopped: the port no longer answers */
    TEST_CHECK(http(port, "GET", "/metrics", &r) == -1);
}

int main(void)
{
    test_names();
    test_exposition();
    test_concurrent_adds();
    test_http();
    printf("test_metrics: ok\n");
    return 0;
}
