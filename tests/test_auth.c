/*
 * test_auth.c - integration: bearer token and TLS on real zs-server
 * processes (127.0.0.1, one server per configuration).
 *
 * Checks:
 *  1. --token-file: a client with the token does Hello + Initialize + Push +
 *     Commit + Pull (bitwise equal to a local zs_adam_update); no token and a
 *     wrong token get ZS_ERR_UNAUTH with a message naming the bearer token,
 *     on a unary call (Hello) and on a client stream (Initialize), and the
 *     refused Initialize changed nothing.
 *  2. TLS (--tls-cert/--tls-key, a self-signed EC certificate with SAN
 *     IP:127.0.0.1 made at test time with the openssl CLI): a client with
 *     tls_ca_pem = that certificate does the same round trip; a plaintext
 *     client, a client trusting another CA, and a TLS client to a plaintext
 *     server each get ZS_ERR_UNAVAILABLE quickly (timeout 4 s, no retries),
 *     not a hang.
 *     16 concurrent 3 MiB Hellos without the token are refused before their
 *     bodies are read (the server's peak RSS grows by < 16 MiB); with the
 *     token one is read and refused for its size (unary limit 64 KiB). A
 *     token file that is empty or blank, or holds a character a client
 *     cannot send in a header, makes zs-server refuse to start (exit 2).
 *  3. Token + TLS together: the round trip works with both; TLS without the
 *     token or with a wrong one gets ZS_ERR_UNAUTH.
 *  4. With a token configured, a method the server does not have is refused
 *     for the token first (ZS_ERR_UNAUTH, naming neither the method nor the
 *     protocol version), plaintext and TLS; with the token it is
 *     ZS_ERR_UNIMPLEMENTED.
 * Needs /usr/bin/openssl (deploy/install-deps.sh installs it).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
#include "zs_rpc.h"
#include "zs_synth.h"
#include "zs_test.h"

#define OPENSSL "/usr/bin/openssl"
#define NPARAM  300007ull /* two 1 MiB fp32 chunks and a bit */
#define TOKEN   "zs-test-token-4f1c9a"
#define MODEL   "auth-model"

static const char *g_tmp;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whole file as a NUL-terminated string (the test exits on failure). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    TEST_CHECKF(f, "cannot open %s", path);
    char *buf = malloc(1 << 16);
    TEST_CHECK(buf);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    TEST_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* Self-signed EC P-256 certificate + key in g_tmp/<name>.{crt,key}; returns
 * the certificate's PEM text. */
static char *make_cert(const char *name)
{
    char cmd[2048], crt[512], key[512], log[512];
    snprintf(crt, sizeof crt, "%s/%s.crt", g_tmp, name);
    snprintf(key, sizeof key, "%s/%s.key", g_tmp, name);
    snprintf(log, sizeof log, "%s/%s.log", g_tmp, name);
    snprintf(cmd, sizeof cmd,
             OPENSSL " req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                     "-keyout '%s' -out '%s' -days 2 -subj /CN=zeroshard-test-%s "
                     "-addext subjectAltName=IP:127.0.0.1 > '%s' 2>&1",
             key, crt, name, log);
    int rc = system(cmd);
    if (rc != 0) {
        char *out = slurp(log);
        fprintf(stderr, "FAIL: openssl could not make a certificate (status %d):\n%s\n", rc, out);
        exit(1);
    }
    return slurp(crt);
}

/* The reference: one AdamW step of the synthetic model, as the server does. */
typedef struct {
    float *p;
    uint16_t *bf16;
} ref_t;

static zs_step_scalars_t scalars(void)
{
    zs_step_scalars_t s = {1, 0.5f, 1.0f, 2e-3f, 0, ZS_DTYPE_BF16};
    return s;
}

static ref_t reference(void)
{
    ref_t r = {malloc(NPARAM * 4), malloc(NPARAM * 2)};
    float *m = calloc(NPARAM, 4), *v = calloc(NPARAM, 4), *g = malloc(NPARAM * 4);
    float *tmp = malloc(NPARAM * 4);
    TEST_CHECK(r.p && r.bf16 && m && v && g && tmp);
    for (uint64_t i = 0; i < NPARAM; i++)
        r.p[i] = zs_synth_weight(i);
    zs_synth_grad(1, 0, NPARAM, g, tmp); /* step 1: fp32 gradients */
    zs_adam_hparams_t hp = zs_synth_hparams();
    zs_step_scalars_t sc = scalars();
    zs_adam_step_t st = {sc.lr, 1, sc.grad_scale, sc.clip_coef};
    zs_adam_update(&hp, &st, r.p, m, v, g, zs_synth_dtype(1), r.bf16, ZS_DTYPE_BF16, NPARAM);
    free(m);
    free(v);
    free(g);
    free(tmp);
    return r;
}

static ref_t g_ref;

/* Hello + Initialize + Push + Commit + Pull (fp32 and bf16) through a
 * client with these options; the pulled values must equal the reference. */
static void roundtrip(const char *what, const zs_client_opts_t *o)
{
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(o, &c, &err), err);
    zs_server_info_t info;
    TEST_OK(zs_client_hello(c, NULL, 0, &info, &err), err);
    TEST_CHECKF(!info.initialized, "%s: server should start empty", what);
    float *buf = malloc(NPARAM * 4), *tmp = malloc(NPARAM * 4);
    uint16_t *bf = malloc(NPARAM * 2);
    TEST_CHECK(buf && tmp && bf);
    for (uint64_t i = 0; i < NPARAM; i++)
        buf[i] = zs_synth_weight(i);
    zs_adam_hparams_t hp = zs_synth_hparams();
    TEST_OK(zs_client_init(c, MODEL, NPARAM, &hp, buf, 0, 0, &err), err);
    zs_synth_grad(1, 0, NPARAM, buf, tmp);
    TEST_OK(zs_client_push(c, 1, 0, NPARAM, buf, zs_synth_dtype(1), &err), err);
    zs_step_scalars_t sc = scalars();
    TEST_OK(zs_client_commit(c, &sc, &err), err);
    uint64_t step = 0;
    TEST_OK(zs_client_pull(c, 1, 0, NPARAM, buf, ZS_DTYPE_F32, &step, &err), err);
    TEST_CHECKF(step == 1, "%s: pulled step %llu", what, (unsigned long long)step);
    TEST_CHECKF(memcmp(buf, g_ref.p, NPARAM * 4) == 0, "%s: pulled fp32 differs", what);
    TEST_OK(zs_client_pull(c, 1, 0, NPARAM, bf, ZS_DTYPE_BF16, NULL, &err), err);
    TEST_CHECKF(memcmp(bf, g_ref.bf16, NPARAM * 2) == 0, "%s: pulled bf16 differs", what);
    TEST_OK(zs_client_hello(c, MODEL, NPARAM, &info, &err), err);
    TEST_CHECK(info.initialized && info.applied_step == 1 && info.num_params == NPARAM);
    printf("  %s: hello + init + push + commit + pull of %llu params: OK, bitwise equal\n", what,
           (unsigned long long)NPARAM);
    zs_client_destroy(c);
    free(buf);
    free(tmp);
    free(bf);
}

/* A Hello through these options must fail with `code` within `max_s`
 * seconds and a message containing `needle`. */
static void expect_refused(const char *what, const zs_client_opts_t *o, int code,
                           const char *needle, double max_s)
{
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(o, &c, &err), err);
    double t0 = now_s();
    int rc = zs_client_hello(c, NULL, 0, NULL, &err);
    double dt = now_s() - t0;
    TEST_CHECKF(rc == code, "%s: got %s (%s), want %s", what, zs_status_name(rc), err.msg,
                zs_status_name(code));
    TEST_CHECKF(strstr(err.msg, needle), "%s: message '%s' does not mention '%s'", what, err.msg,
                needle);
    TEST_CHECKF(dt < max_s, "%s: took %.2f s (limit %.1f s): a hang, not a refusal", what, dt,
                max_s);
    printf("  %s: %s in %.3f s: %s\n", what, zs_status_name(rc), dt, err.msg);
    zs_client_destroy(c);
}

/* A method the server does not have, called with `token` (NULL: none)
 * over a channel trusting ca_pem (NULL: plaintext): with a token configured
 * and none or a wrong one sent, the answer is UNAUTH naming the bearer token
 * and nothing about the method or the protocol version (issue 18: it was
 * UNIMPLEMENTED with the version, before the token was checked); with the
 * right token, UNIMPLEMENTED naming the method. */
static void expect_unknown_method(const char *what, const char *addr, const char *ca_pem,
                                  const char *token, int code)
{
    grpc_channel *ch = zs_channel_create(addr, ca_pem);
    Zeroshard__ListRequest q = ZEROSHARD__LIST_REQUEST__INIT;
    ProtobufCMessage *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    int rc = zs_unary(ch, "/zeroshard.Shard/NoSuchMethod", token, 4000, addr, &q.base,
                      &zeroshard__list_reply__descriptor, &r, &err);
    TEST_CHECKF(rc == code, "%s: unknown method got %s (%s), want %s", what, zs_status_name(rc),
                err.msg, zs_status_name(code));
    if (code == ZS_ERR_UNAUTH)
        TEST_CHECKF(strstr(err.msg, "bearer token") && !strstr(err.msg, "NoSuchMethod") &&
                        !strstr(err.msg, "protocol"),
                    "%s: message '%s' must name the token and nothing else", what, err.msg);
    else
        TEST_CHECKF(strstr(err.msg, "unknown method"), "%s: message '%s'", what, err.msg);
    if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    grpc_channel_destroy(ch);
    printf("  unknown method, %s: %s: %s\n", what, zs_status_name(rc), err.msg);
}

/* A client stream (Initialize of another model, overwrite) through these
 * options must be refused with ZS_ERR_UNAUTH. */
static void expect_stream_unauth(const char *what, const zs_client_opts_t *o)
{
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(o, &c, &err), err);
    float *w = calloc(NPARAM, 4);
    TEST_CHECK(w);
    zs_adam_hparams_t hp = zs_synth_hparams();
    int rc = zs_client_init(c, "intruder", NPARAM, &hp, w, 0, 1, &err);
    TEST_CHECKF(rc == ZS_ERR_UNAUTH && strstr(err.msg, "bearer token"),
                "%s: Initialize got %s (%s), want ZS_ERR_UNAUTH", what, zs_status_name(rc),
                err.msg);
    printf("  %s: Initialize stream refused: %s\n", what, err.msg);
    free(w);
    zs_client_destroy(c);
}

/* The model on the server is still the one the round trip left. */
static void expect_unchanged(const zs_client_opts_t *o)
{
    zs_client_t *c;
    zs_err_t err;
    zs_err_clear(&err);
    TEST_OK(zs_client_create(o, &c, &err), err);
    zs_server_info_t info;
    TEST_OK(zs_client_hello(c, NULL, 0, &info, &err), err);
    TEST_CHECKF(strcmp(info.model_name, MODEL) == 0 && info.applied_step == 1,
                "state changed by a refused call: model '%s' step %llu", info.model_name,
                (unsigned long long)info.applied_step);
    float *p = malloc(NPARAM * 4);
    TEST_CHECK(p);
    TEST_OK(zs_client_get_state(c, 0, 0, NPARAM, p, &err), err);
    TEST_CHECK(memcmp(p, g_ref.p, NPARAM * 4) == 0);
    printf("  refused calls left model '%s' at step 1 unchanged\n", info.model_name);
    free(p);
    zs_client_destroy(c);
}

/* zs-server with a token file holding `text` must refuse to start: exit
 * status 2 within 10 s and a message on stderr containing `needle`. */
static void expect_start_refused(const char *what, const char *text, size_t len, const char *needle)
{
    char tokfile[512], log[512], cmd[2048];
    snprintf(tokfile, sizeof tokfile, "%s/bad-token", g_tmp);
    snprintf(log, sizeof log, "%s/bad-token.log", g_tmp);
    FILE *f = fopen(tokfile, "wb");
    TEST_CHECK(f && fwrite(text, 1, len, f) == len && fclose(f) == 0);
    snprintf(cmd, sizeof cmd,
             "timeout 10 %s/server/zs-server --listen 127.0.0.1:0 --data '%s/bad-token-db' "
             "--token-file '%s' > '%s' 2>&1",
             ZS_BINARY_DIR, g_tmp, tokfile, log);
    int st = system(cmd);
    char *out = slurp(log);
    TEST_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 2,
                "%s: zs-server exit status %d (124: it kept serving); output:\n%s", what,
                WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
    TEST_CHECKF(strstr(out, needle), "%s: output lacks '%s':\n%s", what, needle, out);
    out[strcspn(out, "\n")] = '\0';
    printf("  %s: refused to start: %s\n", what, out);
    free(out);
}

/* VmHWM (peak resident set, KiB) of a process. */
static long vm_hwm_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    TEST_CHECK(f);
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    fclose(f);
    TEST_CHECK(kib > 0);
    return kib;
}

#define BIG_HELLOS 8
#define BIG_HELLO  (32u << 20) /* bytes of model name: what issue 9 sent */

typedef struct {
    const char *addr;
    const char *token;
    size_t bytes; /* of model name */
    int rc;
    char msg[ZS_ERR_MSG_MAX];
} big_hello_t;

/* One Hello carrying a model name of b->bytes, on its own channel. */
static void *big_hello(void *p)
{
    big_hello_t *b = p;
    char *name = malloc(b->bytes + 1);
    TEST_CHECK(name);
    memset(name, 'n', b->bytes);
    name[b->bytes] = '\0';
    Zeroshard__HelloRequest q = ZEROSHARD__HELLO_REQUEST__INIT;
    q.protocol_version = ZS_PROTOCOL_VERSION;
    q.model_name = name;
    grpc_channel *ch = zs_channel_create(b->addr, NULL);
    ProtobufCMessage *r = NULL;
    zs_err_t err;
    zs_err_clear(&err);
    /* Our channels give a connection attempt 100 ms, which 8 concurrent 32 MiB
     * sends on 2 shared cores can miss: retry UNAVAILABLE (not what is tested). */
    for (int k = 0; k < 50; k++) {
        b->rc = zs_unary(ch, "/zeroshard.Shard/Hello", b->token, 20000, b->addr, &q.base,
                         &zeroshard__hello_reply__descriptor, &r, &err);
        if (b->rc != ZS_ERR_UNAVAILABLE)
            break;
        struct timespec ts = {0, 100000000L}; /* past the channel's reconnect backoff */
        nanosleep(&ts, NULL);
    }
    snprintf(b->msg, sizeof b->msg, "%s", err.msg);
    if (r)
        protobuf_c_message_free_unpacked(r, NULL);
    grpc_channel_destroy(ch);
    free(name);
    return NULL;
}

/* 8 concurrent unauthenticated 32 MiB Hellos (issue 9: the server's RSS went
 * 27 -> 156 MB): each must be refused from its metadata, before its body is
 * read, so the server's peak memory grows by far less than the 256 MiB they
 * carry. With the token: a 1 MiB Hello is read and refused for its size (the
 * unary limit, 64 KiB), a 32 MiB one by gRPC's receive limit. */
static void expect_no_body_read(const zs_test_server_t *s)
{
    long before = vm_hwm_kib(s->pid);
    pthread_t t[BIG_HELLOS];
    big_hello_t b[BIG_HELLOS];
    for (int i = 0; i < BIG_HELLOS; i++) {
        b[i] = (big_hello_t){s->addr, NULL, BIG_HELLO, 0, ""};
        TEST_CHECK(pthread_create(&t[i], NULL, big_hello, &b[i]) == 0);
    }
    for (int i = 0; i < BIG_HELLOS; i++) {
        pthread_join(t[i], NULL);
        TEST_CHECKF(b[i].rc == ZS_ERR_UNAUTH, "big Hello %d without a token: %s: %s", i,
                    zs_status_name(b[i].rc), b[i].msg);
    }
    long after = vm_hwm_kib(s->pid);
    printf("  %d unauthenticated Hellos of %u MiB: refused; server peak RSS %.1f -> %.1f MiB\n",
           BIG_HELLOS, BIG_HELLO >> 20, before / 1024.0, after / 1024.0);
    TEST_CHECKF(after - before < 16 * 1024, "the server read their bodies: +%.1f MiB",
                (after - before) / 1024.0);
    big_hello_t a = {s->addr, TOKEN, 1u << 20, 0, ""};
    big_hello(&a);
    TEST_CHECKF(a.rc == ZS_ERR_INVALID && strstr(a.msg, "exceeds the 65536 limit"),
                "authenticated 1 MiB Hello: %s: %s", zs_status_name(a.rc), a.msg);
    printf("  authenticated Hello of 1 MiB: %s\n", a.msg);
    a = (big_hello_t){s->addr, TOKEN, BIG_HELLO, 0, ""};
    big_hello(&a);
    TEST_CHECKF(zs_status_to_grpc(a.rc) == GRPC_STATUS_RESOURCE_EXHAUSTED,
                "authenticated 32 MiB Hello: %s: %s", zs_status_name(a.rc), a.msg);
    printf("  authenticated Hello of 32 MiB: %s\n", a.msg);
}

static void start(zs_test_server_t *s, const char *name, const char *extra)
{
    memset(s, 0, sizeof *s);
    snprintf(s->data_dir, sizeof s->data_dir, "%s/%s", g_tmp, name);
    snprintf(s->extra, sizeof s->extra, "%s", extra);
    zs_test_server_start(s);
    printf("%s: zs-server on %s %s\n", name, s->addr, extra);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    double t0 = now_s();
    if (access(OPENSSL, X_OK) != 0) {
        fprintf(stderr,
                "FAIL: %s not found: the TLS checks make their certificate with the "
                "openssl CLI; run deploy/install-deps.sh (it installs the openssl "
                "package)\n",
                OPENSSL);
        return 1;
    }
    g_tmp = zs_test_tmpdir("auth");
    g_ref = reference();
    char tokfile[512], extra[256];
    snprintf(tokfile, sizeof tokfile, "%s/token.txt", g_tmp);
    write_file(tokfile, TOKEN "\n"); /* the trailing newline is not part of the token */
    char *cert = make_cert("server");
    char *other = make_cert("other");
    char crt[512], key[512];
    snprintf(crt, sizeof crt, "%s/server.crt", g_tmp);
    snprintf(key, sizeof key, "%s/server.key", g_tmp);

    /* 1. Token, plaintext. */
    zs_test_server_t tok;
    TEST_CHECK(snprintf(extra, sizeof extra, "--token-file %s", tokfile) < (int)sizeof extra);
    start(&tok, "token", extra);
    zs_client_opts_t good = {tok.addr, TOKEN, NULL, 20000, -1};
    roundtrip("right token", &good);
    zs_client_opts_t none = {tok.addr, NULL, NULL, 4000, -1};
    zs_client_opts_t wrong = {tok.addr, TOKEN "x", NULL, 4000, -1};
    zs_client_opts_t prefix = {tok.addr, "zs-test", NULL, 4000, -1};
    expect_refused("no token", &none, ZS_ERR_UNAUTH, "bearer token", 4.0);
    expect_refused("wrong token", &wrong, ZS_ERR_UNAUTH, "bearer token", 4.0);
    expect_refused("token prefix only", &prefix, ZS_ERR_UNAUTH, "bearer token", 4.0);
    expect_stream_unauth("no token", &none);
    expect_stream_unauth("wrong token", &wrong);
    expect_unknown_method("no token", tok.addr, NULL, NULL, ZS_ERR_UNAUTH);
    expect_unknown_method("wrong token", tok.addr, NULL, TOKEN "x", ZS_ERR_UNAUTH);
    expect_unknown_method("right token", tok.addr, NULL, TOKEN, ZS_ERR_UNIMPLEMENTED);
    expect_unchanged(&good);
    expect_no_body_read(&tok);
    expect_unchanged(&good);
    expect_start_refused("empty token file", "", 0, "empty");
    expect_start_refused("token file of a newline", "\n", 1, "empty");
    expect_start_refused("token file of blanks", "  \t \r\n \n", 10, "empty");
    expect_start_refused("token with a tab inside", "abc\tdef\n", 8, "character");
    expect_start_refused("token with a byte above 0x7e", "abc\xc3\xa9\n", 6, "character");

    /* 2. TLS, no token. */
    zs_test_server_t tls;
    TEST_CHECK(snprintf(extra, sizeof extra, "--tls-cert %s --tls-key %s", crt, key) <
               (int)sizeof extra);
    start(&tls, "tls", extra);
    zs_client_opts_t tgood = {tls.addr, NULL, cert, 20000, -1};
    roundtrip("TLS", &tgood);
    zs_client_opts_t plain = {tls.addr, NULL, NULL, 4000, -1};
    expect_refused("plaintext client to TLS server", &plain, ZS_ERR_UNAVAILABLE, tls.addr, 3.9);
    zs_client_opts_t wrongca = {tls.addr, NULL, other, 4000, -1};
    expect_refused("TLS client trusting another CA", &wrongca, ZS_ERR_UNAVAILABLE, tls.addr, 3.9);
    zs_client_opts_t tls2plain = {tok.addr, TOKEN, cert, 4000, -1};
    expect_refused("TLS client to plaintext server", &tls2plain, ZS_ERR_UNAVAILABLE, tok.addr, 3.9);

    /* 3. TLS + token. */
    zs_test_server_t both;
    TEST_CHECK(snprintf(extra, sizeof extra, "--tls-cert %s --tls-key %s --token-file %s", crt, key,
                        tokfile) < (int)sizeof extra);
    start(&both, "tls+token", extra);
    zs_client_opts_t bgood = {both.addr, TOKEN, cert, 20000, -1};
    roundtrip("TLS + right token", &bgood);
    zs_client_opts_t bnone = {both.addr, NULL, cert, 4000, -1};
    zs_client_opts_t bwrong = {both.addr, "not-the-token", cert, 4000, -1};
    expect_refused("TLS, no token", &bnone, ZS_ERR_UNAUTH, "bearer token", 4.0);
    expect_refused("TLS, wrong token", &bwrong, ZS_ERR_UNAUTH, "bearer token", 4.0);
    expect_stream_unauth("TLS, wrong token", &bwrong);
    expect_unknown_method("TLS, no token", both.addr, cert, NULL, ZS_ERR_UNAUTH);
    expect_unknown_method("TLS, right token", both.addr, cert, TOKEN, ZS_ERR_UNIMPLEMENTED);
    expect_unchanged(&bgood);

    zs_test_server_stop(&tok, SIGTERM);
    zs_test_server_stop(&tls, SIGTERM);
    zs_test_server_stop(&both, SIGTERM);
    free(cert);
    free(other);
    free(g_ref.p);
    free(g_ref.bf16);
    printf("PASS test_auth (%.1f s)\n", now_s() - t0);
    return 0;
}
