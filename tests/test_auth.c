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
 *  3. Token + TLS together: the round trip works with both; TLS without the
 *     token or with a wrong one gets ZS_ERR_UNAUTH.
 * Needs /usr/bin/openssl (deploy/install-deps.sh installs it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zs_client.h"
#include "zs_proc.h"
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
    expect_unchanged(&good);

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
