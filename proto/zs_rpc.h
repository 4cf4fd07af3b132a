/*
 * zs_rpc.h - gRPC core helpers shared by zs-server and the shard client:
 * bulk framing, blocking call wrappers, a threaded server dispatcher, status
 * mapping and bearer-token metadata.
 *
 * Framing. A streamed bulk message is a protobuf message whose field 15
 * (`bytes data`) carries raw elements. zs_frame_build packs the other fields
 * with protobuf-c and appends field 15 as a slice over the caller's memory
 * (no copy). zs_frame_parse walks a received byte buffer's slices, unpacks
 * every field but 15 with protobuf-c, and remembers where field 15 lies so
 * zs_frame_copy can copy it once, straight into its destination, after the
 * caller has validated the header. Payload sizes are checked against the
 * buffer before anything is allocated.
 *
 * Calls. Every call owns a private pluck completion queue, and one thread
 * drives it with blocking operations. That keeps each handler a plain
 * sequential function (read, validate, copy, reply), which is what a person
 * can audit. See docs/protocol.md for the server's threading model.
 *
 * Does not: retry, pick servers, or know about parameters (the client library
 * in worker/ does that).
 */
#ifndef ZS_RPC_H
#define ZS_RPC_H

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "zs_status.h"
#include "zeroshard.pb-c.h"

/* Protocol versions (docs/protocol.md, "Versions and negotiation"). A
 * client states the highest version it speaks in Hello and Initialize; the
 * server answers with the highest both speak (the lower of the two) and
 * both then use that. ZS_PROTOCOL_VERSION is the highest this build speaks,
 * ZS_PROTOCOL_VERSION_MIN the lowest a server still negotiates down to
 * (below it a request is refused: it could not work). */
#define ZS_PROTOCOL_VERSION     3
#define ZS_PROTOCOL_VERSION_MIN 1
/* The first version with PushChunk.expect and Counters.spec_* (speculative
 * updates, issue 18): a session negotiated below it never speculates. */
#define ZS_PROTOCOL_V_SPECULATION 2
/* The first version with parameter groups: InitRequest.groups,
 * CommitRequest.group_lr, StepExpect.group_lr, HelloReply.groups,
 * CheckpointMeta.groups (docs/protocol.md, "Parameter groups"). */
#define ZS_PROTOCOL_V_GROUPS 3
/* The largest training step a server accepts (Initialize start_step,
 * SetStep, Push, Commit, Pull min_step, a checkpoint's steps): 2^53 - 1, so
 * step + 1 never wraps, Adam's t fits an int64, and any JSON or double
 * consumer shows it exactly. At one step a millisecond that is 285,000
 * years. */
#define ZS_STEP_MAX            ((1ull << 53) - 1)
#define ZS_RPC_MAX_META        (64u << 10) /* bytes: largest non-payload part of a message */
#define ZS_RPC_CHUNK_BYTES     (1u << 20)  /* bulk chunk size: 1 MiB measured best */
#define ZS_RPC_MAX_CHUNK_BYTES (4u << 20)  /* bytes of payload in a chunk we receive */
/* Bytes a pushed chunk's shared-memory reference may name
 * (HelloReply.shm_chunk_bytes): no payload crosses gRPC, so the receive
 * limit does not bind it, and four times fewer messages per pushed byte
 * cut the worker's per-message cost (bench/RESULTS.md). */
#define ZS_RPC_MAX_SHM_CHUNK_BYTES (16u << 20)
/* Bytes of payload in a pulled chunk: PullRequest.chunk_bytes at most. A
 * PullChunk's header and field-15 framing take < 64 bytes, so with 4 KiB
 * to spare every message fits the 4 MiB receive limit stock gRPC clients
 * have by default. */
#define ZS_RPC_MAX_PULL_CHUNK_BYTES ((4u << 20) - 4096u)
/* Bytes: the largest message either side accepts (gRPC's receive limit): a
 * chunk of the largest payload with the largest header, and a little for
 * field 15's key and length. Anything bigger is never valid, so gRPC refuses
 * it before a handler sees it. Unary requests are held to ZS_RPC_MAX_META. */
#define ZS_RPC_MAX_MESSAGE (ZS_RPC_MAX_CHUNK_BYTES + ZS_RPC_MAX_META + 16u)

/* The check for gRPC core call results: evaluates to ZS_OK, or to
 * ZS_ERR_INTERNAL with err (may be NULL) naming the call, file, line, gRPC's
 * error name and a hint. Usage: rc = ZS_GRPC_CHECK(grpc_call_start_batch(...), err). */
#define ZS_GRPC_CHECK(expr, err) zs__grpc_check((expr), #expr, __FILE__, __LINE__, (err))
int zs__grpc_check(grpc_call_error e, const char *what, const char *file, int line, zs_err_t *err);

/* ---- framing ---------------------------------------------------------- */

/* A parsed bulk message: the payload's place among the buffer's slices. */
typedef struct zs_frame {
    grpc_slice *slices; /* refs owned by the frame */
    size_t nslices;
    size_t pay_slice, pay_off; /* where field 15 starts */
    size_t pay_len;            /* its length in bytes (0: absent) */
} zs_frame_t;

/* Build a byte buffer: `meta` packed, then field 15 = payload[0..len) wrapped
 * without copy. `release(ud)` is called (from any thread) when gRPC drops
 * its last reference to the payload; until then the memory must stay valid
 * and unchanged. release may be NULL (memory outlives the call). Returns NULL
 * on allocation failure. The caller destroys the buffer with
 * grpc_byte_buffer_destroy after handing it to a send op. */
grpc_byte_buffer *zs_frame_build(const ProtobufCMessage *meta, const void *payload, size_t len,
                                 void (*release)(void *), void *ud);

/* Parse `bb` (not consumed; the caller still destroys it). On success *out is
 * the unpacked message of type `desc` without field 15 (free with
 * protobuf_c_message_free_unpacked(*out, NULL)) and `fr` locates the payload
 * (release with zs_frame_deinit). Refuses malformed wire data or a non-payload
 * part above ZS_RPC_MAX_META with ZS_ERR_INVALID. */
int zs_frame_parse(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                   ProtobufCMessage **out, zs_frame_t *fr, zs_err_t *err);

/* Copy the whole payload (fr->pay_len bytes) to dst. */
void zs_frame_copy(const zs_frame_t *fr, void *dst);

/* Drop the frame's slice refs. Safe on a zeroed frame. */
void zs_frame_deinit(zs_frame_t *fr);

/* Pack a plain (unary) message into a new byte buffer; NULL on failure. */
grpc_byte_buffer *zs_msg_build(const ProtobufCMessage *msg);

/* Unpack a plain message; *out freed with protobuf_c_message_free_unpacked. */
int zs_msg_parse(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                 ProtobufCMessage **out, zs_err_t *err);

/* ---- client calls ----------------------------------------------------- */

typedef struct zs_ccall {
    grpc_channel *ch; /* not owned */
    grpc_call *call;
    grpc_completion_queue *cq; /* pluck queue private to this call */
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    grpc_metadata auth; /* authorization header when a token is set */
    int nmd;
    int status_pending; /* RECV_STATUS_ON_CLIENT started, not yet plucked */
    int initmd_pending; /* RECV_INITIAL_METADATA started, not yet plucked */
    int closed;         /* SEND_CLOSE_FROM_CLIENT done */
    int md_pending;     /* SEND_INITIAL_METADATA goes with the next batch */
    const char *peer;   /* for messages: the server's address */
    const char *method; /* for messages */
} zs_ccall_t;

/* Start a call to `method` ("/zeroshard.Shard/Push") on `ch` with a deadline
 * `timeout_ms` from now, bearer `token` (may be NULL; copied), arming
 * RECV_STATUS; the initial metadata goes out with the first send, receive or
 * finish, so a server that cannot be reached is reported there ("unreachable
 * (cannot start METHOD ...)"). `peer` and `method` name the call in errors
 * (kept by pointer). On error the call is already cleaned up. */
int zs_ccall_start(zs_ccall_t *c, grpc_channel *ch, const char *method, const char *token,
                   int timeout_ms, const char *peer, zs_err_t *err);

/* Send one message (the buffer is destroyed here whatever happens). A send
 * that fails because the server already finished the call returns the
 * server's status and message. */
int zs_ccall_send(zs_ccall_t *c, grpc_byte_buffer *bb, zs_err_t *err);

/* Half-close (if not yet) and receive one message: *bb is NULL at the end of
 * the server's stream; then the call's status is returned (ZS_OK or the
 * server's refusal in err). A non-NULL *bb is the caller's to destroy. */
int zs_ccall_recv(zs_ccall_t *c, grpc_byte_buffer **bb, zs_err_t *err);

/* Wait for the final status (half-closing first); ZS_OK or the refusal. */
int zs_ccall_finish(zs_ccall_t *c, zs_err_t *err);

/* Release everything (cancels the call if still running). Idempotent. */
void zs_ccall_destroy(zs_ccall_t *c);

/* One unary call: request -> *reply (unpacked, caller frees). */
int zs_unary(grpc_channel *ch, const char *method, const char *token, int timeout_ms,
             const char *peer, const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply, zs_err_t *err);

/* Channel to `target` ("host:port"); TLS when ca_pem (PEM text) is not NULL.
 * Sets the receive limit to ZS_RPC_MAX_MESSAGE and a private subchannel so
 * several channels to one server are separate connections. */
grpc_channel *zs_channel_create(const char *target, const char *ca_pem);

/* ---- server ----------------------------------------------------------- */

typedef enum { ZS_RPC_UNARY, ZS_RPC_CLIENT_STREAM, ZS_RPC_SERVER_STREAM } zs_rpc_kind_t;

typedef struct zs_scall {
    grpc_call *call;
    grpc_completion_queue *cq; /* pluck queue bound to this call */
    gpr_timespec deadline;
    grpc_metadata_array request_md;
    grpc_byte_buffer *request; /* the request (unary, server streaming), received after the
                                  token check; NULL if none was sent; owned */
    int sent_initial_md;
    int finished;
    int close_armed, close_done; /* RECV_CLOSE_ON_SERVER started early / completed */
    int close_cancelled;         /* its result */
    int method;                  /* index into the method table */
    char peer[96];
    _Atomic uint64_t *answered; /* the server's counters of this call's method, by gRPC code:
                                   zs_scall_finish counts the status it sends */
} zs_scall_t;

/* A handler runs on its own thread, reads/writes with zs_scall_* and returns
 * a status; the dispatcher then sends it (with err->msg) unless the handler
 * already finished the call. */
typedef int (*zs_rpc_handler_fn)(void *ctx, zs_scall_t *call, zs_err_t *err);

typedef struct zs_rpc_method {
    const char *path; /* "/zeroshard.Shard/Push" */
    zs_rpc_kind_t kind;
    zs_rpc_handler_fn fn;
} zs_rpc_method_t;

typedef struct zs_rpc_server_opts {
    const char *listen;        /* "host:port"; port 0 picks a free one */
    const char *token;         /* required bearer token, or NULL or "": none */
    const char *tls_cert_pem;  /* server certificate chain (PEM text) or NULL */
    const char *tls_key_pem;   /* its private key (PEM text) */
    int max_calls;             /* concurrent handler threads (default 64) */
    uint32_t protocol_version; /* named in UNIMPLEMENTED's sentence (0: ZS_PROTOCOL_VERSION) */
} zs_rpc_server_opts_t;

typedef struct zs_rpc_server zs_rpc_server_t;

/* Bind, register the methods (table kept by pointer) and start serving; ctx
 * is passed to every handler. *out is freed by zs_rpc_server_destroy. */
int zs_rpc_server_create(const zs_rpc_server_opts_t *opts, const zs_rpc_method_t *methods,
                         int nmethods, void *ctx, zs_rpc_server_t **out, zs_err_t *err);

/* Port actually bound (useful with port 0). */
int zs_rpc_server_port(const zs_rpc_server_t *srv);

/* Stop accepting, cancel calls in flight, wait for handler threads, free. */
void zs_rpc_server_destroy(zs_rpc_server_t *srv);

#define ZS_RPC_NCODES 17 /* gRPC status codes 0 (OK) .. 16 (UNAUTHENTICATED) */

/* Calls answered since start, by method and the gRPC status code sent
 * (token and busy refusals included): out[m * ZS_RPC_NCODES + code] for
 * method m of the table, and m = nmethods for calls to methods not in it.
 * `out` holds (nmethods + 1) * ZS_RPC_NCODES entries. Lock-free. */
void zs_rpc_server_answered(zs_rpc_server_t *srv, uint64_t *out);

/* Handler threads running now (calls in flight). */
int zs_rpc_server_active(zs_rpc_server_t *srv);

/* Receive the next client-stream message; *bb NULL at end of stream.
 * A cancelled or broken call gives ZS_ERR_CANCELLED. */
int zs_scall_recv(zs_scall_t *c, grpc_byte_buffer **bb, zs_err_t *err);

/* Send one message (destroys bb). */
int zs_scall_send(zs_scall_t *c, grpc_byte_buffer *bb, zs_err_t *err);

/* 1 if the call has ended from the client's side: cancelled, its
 * connection gone, or its deadline passed; 0 while it is alive. Never
 * blocks. The first call arms gRPC's close notification
 * (RECV_CLOSE_ON_SERVER), which completes only when the call ends, so a
 * handler that waits (Pull) polls this between waits. Handler thread only. */
int zs_scall_cancelled(zs_scall_t *c);

/* Send the final status; `reply` (may be NULL) goes first as the last
 * message (destroyed here). code is a zs status, msg its sentence. */
int zs_scall_finish(zs_scall_t *c, grpc_byte_buffer *reply, int code, const char *msg);

/* 1 if want[0..want_len) equals got[0..got_len), comparing in time that
 * depends on want_len only (the bearer token check). */
int zs__ct_equal(const void *want, size_t want_len, const void *got, size_t got_len);

/* gpr_timespec `ms` milliseconds from now (monotonic clock). */
gpr_timespec zs_deadline_ms(int64_t ms);

#endif
