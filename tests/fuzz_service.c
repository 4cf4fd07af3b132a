/*
 * fuzz_service.c - libFuzzer target for zs-server's request handling: the
 * frame parser (zs_frame_parse, zs_msg_parse) and every method's request
 * validation, through the real handlers of server/zs_service.c over a real
 * shard (zs_shard.h) and store, without gRPC's transport.
 *
 * How. zs_rpc_server.c is not linked: this file supplies zs_scall_recv,
 * zs_scall_send, zs_scall_finish and zs_scall_cancelled, so a handler reads
 * its request messages from the fuzz input and its replies are dropped. A
 * call's deadline is "now" and it counts as cancelled, so a Pull never
 * waits. The shard lives for the whole run in a temp dir (/dev/shm when
 * there is one) and starts with model "fuzz" (P = 8192, one server) at
 * step 0; inputs change it as real requests would (bounded by a 256 MiB
 * memory budget).
 *
 * Input: byte 0 picks the method (mod 12), byte 1 the slice size the
 * messages are cut into (1..256 bytes, 0: one slice), then messages as
 * [u16 little-endian length][bytes], as many as fit. Unary and server-stream
 * methods get the first one as their request; client streams get them all.
 *
 * Built and run by tests/fuzz_service.sh (clang + libFuzzer); with
 * -DZS_FUZZ_SEEDS it is instead a program that writes the seed corpus (a
 * valid request sequence for every method) into the directory argv[1].
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zs_log.h"
#include "zs_rpc.h"
#include "zs_service.h"
#include "zs_shard.h"

#define FUZZ_P 8192u

/* ---- the input as a message feed ------------------------------------------ */

static const uint8_t *g_in;
static size_t g_left;
static unsigned g_cut; /* slice size; 0: whole */

/* The next message of the input as a byte buffer cut into slices, or NULL
 * at the end of the input (the end of the stream). */
static grpc_byte_buffer *next_msg(void)
{
    if (g_left < 2)
        return NULL;
    size_t len = (size_t)g_in[0] | (size_t)g_in[1] << 8;
    g_in += 2;
    g_left -= 2;
    if (len > g_left)
        len = g_left;
    size_t cut = g_cut ? g_cut : (len ? len : 1);
    size_t ns = len ? (len + cut - 1) / cut : 1;
    grpc_slice *s = malloc(ns * sizeof *s);
    if (!s)
        return NULL;
    for (size_t i = 0; i < ns; i++) {
        size_t a = i * cut, k = len - a < cut ? len - a : cut;
        s[i] = grpc_slice_from_copied_buffer((const char *)g_in + a, len ? k : 0);
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, ns);
    for (size_t i = 0; i < ns; i++)
        grpc_slice_unref(s[i]);
    free(s);
    g_in += len;
    g_left -= len;
    return bb;
}

/* ---- zs_scall_*: what zs_rpc_server.c would do, with the feed ------------- */

int zs_scall_recv(zs_scall_t *c, grpc_byte_buffer **bb, zs_err_t *err)
{
    (void)c;
    (void)err;
    *bb = next_msg();
    return ZS_OK;
}

int zs_scall_send(zs_scall_t *c, grpc_byte_buffer *bb, zs_err_t *err)
{
    (void)c;
    if (!bb)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory building a reply");
    grpc_byte_buffer_destroy(bb); /* releases a zero-copy payload at once */
    return ZS_OK;
}

int zs_scall_finish(zs_scall_t *c, grpc_byte_buffer *reply, int code, const char *msg)
{
    (void)code;
    (void)msg;
    if (reply)
        grpc_byte_buffer_destroy(reply);
    c->finished = 1;
    return ZS_OK;
}

int zs_scall_cancelled(zs_scall_t *c)
{
    (void)c;
    return 1;
}

/* ---- the shard ------------------------------------------------------------- */

static zs_shard_t *g_sh;
static const zs_rpc_method_t *g_methods;
static int g_nmethods;
static char g_dir[64];

/* At exit: the shard's temp dir goes (a crash leaves it for inspection). */
static void cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (g_dir[0] && system(cmd) != 0)
        fprintf(stderr, "fuzz: could not remove %s\n", g_dir);
}

static int setup(void)
{
    grpc_init();
    zs_log_set_level(ZS_LOG_ERROR);
    char *dir = g_dir;
    snprintf(dir, sizeof g_dir, "%s/zs-fuzz-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir))
        return -1;
    atexit(cleanup);
    /* a pre-image window: pushes that state expected scalars speculate */
    zs_shard_opts_t o = {dir, 1, 1, "fuzz", 256ull << 20, 64ull << 20};
    zs_err_t err;
    if (zs_shard_create(&o, &g_sh, &err)) {
        fprintf(stderr, "fuzz: shard: %s\n", err.msg);
        return -1;
    }
    zs_shard_identity_t id;
    memset(&id, 0, sizeof id);
    snprintf(id.model_name, sizeof id.model_name, "fuzz");
    id.num_params = FUZZ_P;
    id.num_servers = 1;
    zs_adam_hparams_t hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    zs_shard_init_t *in;
    float *dst;
    if (zs_shard_init_begin(g_sh, &id, &hp, 0, 0, &in, &err) ||
        zs_shard_init_reserve(in, 0, FUZZ_P, &dst, &err))
        return -1;
    for (unsigned i = 0; i < FUZZ_P; i++)
        dst[i] = 0.01f * (float)(i % 97);
    if (zs_shard_init_end(in, &err))
        return -1;
    g_methods = zs_service_methods(&g_nmethods);
    fprintf(stderr, "fuzz: shard in %s, %d methods\n", dir, g_nmethods);
    return 0;
}

#ifndef ZS_FUZZ_SEEDS

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (setup())
        abort(); /* a harness that cannot start must not report "no crash" */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int m = data[0] % g_nmethods;
    g_cut = data[1];
    g_in = data + 2;
    g_left = size - 2;
    zs_scall_t call;
    memset(&call, 0, sizeof call);
    call.method = m;
    call.deadline = gpr_now(GPR_CLOCK_MONOTONIC);
    snprintf(call.peer, sizeof call.peer, "fuzz");
    if (g_methods[m].kind != ZS_RPC_CLIENT_STREAM)
        call.request = next_msg();
    zs_err_t err;
    zs_err_clear(&err);
    int rc = g_methods[m].fn(g_sh, &call, &err);
    zs_scall_finish(&call, NULL, rc, err.msg);
    if (call.request)
        grpc_byte_buffer_destroy(call.request);
    return 0;
}

#else /* ZS_FUZZ_SEEDS: write the seed corpus */

static uint8_t g_seed[1 << 16];
static size_t g_seed_len;

static void seed_begin(int method, int cut)
{
    g_seed[0] = (uint8_t)method;
    g_seed[1] = (uint8_t)cut;
    g_seed_len = 2;
}

static void seed_add(const ProtobufCMessage *meta, const void *payload, size_t len)
{
    size_t mlen = protobuf_c_message_get_packed_size(meta);
    uint8_t tmp[64];
    size_t hl = 0;
    if (len) { /* field 15 key and length */
        tmp[hl++] = 0x7A;
        size_t v = len;
        for (; v >= 0x80; v >>= 7)
            tmp[hl++] = (uint8_t)(v | 0x80);
        tmp[hl++] = (uint8_t)v;
    }
    size_t total = mlen + hl + len;
    if (g_seed_len + 2 + total > sizeof g_seed)
        return;
    g_seed[g_seed_len++] = (uint8_t)total;
    g_seed[g_seed_len++] = (uint8_t)(total >> 8);
    protobuf_c_message_pack(meta, g_seed + g_seed_len);
    g_seed_len += mlen;
    memcpy(g_seed + g_seed_len, tmp, hl);
    g_seed_len += hl;
    if (len)
        memcpy(g_seed + g_seed_len, payload, len);
    g_seed_len += len;
}

static void seed_write(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(g_seed, 1, g_seed_len, f) != g_seed_len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

/* Index of method `name` in the table. */
static int method(const char *name)
{
    for (int i = 0; i < g_nmethods; i++)
        if (!strcmp(g_methods[i].path + strlen("/zeroshard.Shard/"), name))
            return i;
    fprintf(stderr, "no method %s\n", name);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 2 || setup())
        return 2;
    mkdir(argv[1], 0755);
    static float w[FUZZ_P];
    static uint16_t h[FUZZ_P];
    for (unsigned i = 0; i < FUZZ_P; i++)
        w[i] = 0.001f * (float)i;
    memset(h, 0x3c, sizeof h);
    Zeroshard__AdamConfig a = ZEROSHARD__ADAM_CONFIG__INIT;
    a.lr = 1e-3f;
    a.beta1 = 0.9f;
    a.beta2 = 0.999f;
    a.eps = 1e-8f;

    Zeroshard__HelloRequest hq = ZEROSHARD__HELLO_REQUEST__INIT;
    hq.protocol_version = ZS_PROTOCOL_VERSION;
    hq.model_name = "fuzz";
    hq.num_params = FUZZ_P;
    seed_begin(method("Hello"), 0);
    seed_add(&hq.base, NULL, 0);
    seed_write(argv[1], "hello");

    Zeroshard__InitRequest iq = ZEROSHARD__INIT_REQUEST__INIT;
    iq.protocol_version = ZS_PROTOCOL_VERSION;
    iq.model_name = "fuzz";
    iq.num_params = FUZZ_P;
    iq.num_servers = 1;
    iq.adam = &a;
    Zeroshard__InitChunk ic = ZEROSHARD__INIT_CHUNK__INIT;
    ic.init = &iq;
    ic.count = FUZZ_P / 2;
    seed_begin(method("Initialize"), 7);
    seed_add(&ic.base, w, FUZZ_P / 2 * 4);
    ic.init = NULL;
    ic.offset = FUZZ_P / 2;
    seed_add(&ic.base, w + FUZZ_P / 2, FUZZ_P / 2 * 4);
    seed_write(argv[1], "initialize");

    Zeroshard__PushChunk pc = ZEROSHARD__PUSH_CHUNK__INIT;
    pc.step = 1;
    pc.count = FUZZ_P / 2;
    pc.dtype = ZEROSHARD__DTYPE__BF16;
    seed_begin(method("Push"), 0);
    seed_add(&pc.base, h, FUZZ_P / 2 * 2);
    pc.offset = FUZZ_P / 2;
    seed_add(&pc.base, h, FUZZ_P / 2 * 2);
    seed_write(argv[1], "push");

    /* the same stream stating the commit seed's scalars (speculation) */
    Zeroshard__StepExpect ex = ZEROSHARD__STEP_EXPECT__INIT;
    ex.grad_scale = 1;
    ex.lr = 1e-3f;
    ex.param_dtype = ZEROSHARD__DTYPE__BF16;
    pc.offset = 0;
    pc.expect = &ex;
    seed_begin(method("Push"), 0);
    seed_add(&pc.base, h, FUZZ_P / 2 * 2);
    pc.expect = NULL;
    pc.offset = FUZZ_P / 2;
    seed_add(&pc.base, h, FUZZ_P / 2 * 2);
    seed_write(argv[1], "push_expect");

    Zeroshard__CommitRequest cq = ZEROSHARD__COMMIT_REQUEST__INIT;
    cq.step = 1;
    cq.grad_scale = 1;
    cq.clip_coef = 1;
    cq.lr = 1e-3f;
    cq.param_dtype = ZEROSHARD__DTYPE__BF16;
    seed_begin(method("Commit"), 0);
    seed_add(&cq.base, NULL, 0);
    seed_write(argv[1], "commit");

    Zeroshard__PullRequest pq = ZEROSHARD__PULL_REQUEST__INIT;
    pq.count = FUZZ_P;
    pq.dtype = ZEROSHARD__DTYPE__BF16;
    pq.chunk_bytes = 4096;
    seed_begin(method("Pull"), 3);
    seed_add(&pq.base, NULL, 0);
    seed_write(argv[1], "pull");

    Zeroshard__CheckpointRequest kq = ZEROSHARD__CHECKPOINT_REQUEST__INIT;
    kq.step = 1;
    kq.keep = 1;
    kq.user_meta.data = (uint8_t *)"meta";
    kq.user_meta.len = 4;
    seed_begin(method("Checkpoint"), 0);
    seed_add(&kq.base, NULL, 0);
    seed_write(argv[1], "checkpoint");

    Zeroshard__ListRequest lq = ZEROSHARD__LIST_REQUEST__INIT;
    seed_begin(method("ListCheckpoints"), 0);
    seed_add(&lq.base, NULL, 0);
    seed_write(argv[1], "list");

    Zeroshard__RestoreRequest rq = ZEROSHARD__RESTORE_REQUEST__INIT;
    rq.step = 1;
    seed_begin(method("Restore"), 0);
    seed_add(&rq.base, NULL, 0);
    seed_write(argv[1], "restore");

    Zeroshard__DeleteRequest dq = ZEROSHARD__DELETE_REQUEST__INIT;
    dq.keep = 1;
    seed_begin(method("DeleteCheckpoints"), 0);
    seed_add(&dq.base, NULL, 0);
    seed_write(argv[1], "delete");

    Zeroshard__StateRequest sq = ZEROSHARD__STATE_REQUEST__INIT;
    sq.tensor = ZEROSHARD__TENSOR__EXP_AVG;
    sq.offset = 100;
    sq.count = 1000;
    seed_begin(method("GetState"), 0);
    seed_add(&sq.base, NULL, 0);
    seed_write(argv[1], "getstate");

    Zeroshard__StateChunk sc = ZEROSHARD__STATE_CHUNK__INIT;
    sc.tensor = ZEROSHARD__TENSOR__MASTER;
    sc.count = 1000;
    seed_begin(method("SetState"), 5);
    seed_add(&sc.base, w, 4000);
    sc.tensor = ZEROSHARD__TENSOR__EXP_AVG_SQ;
    sc.offset = 5000;
    seed_add(&sc.base, w, 4000);
    seed_write(argv[1], "setstate");

    Zeroshard__SetStepRequest tq = ZEROSHARD__SET_STEP_REQUEST__INIT;
    tq.step = 7;
    tq.optimizer_step = 5;
    seed_begin(method("SetStep"), 0);
    seed_add(&tq.base, NULL, 0);
    seed_write(argv[1], "setstep");
    printf("12 seeds in %s\n", argv[1]);
    return 0;
}

#endif
