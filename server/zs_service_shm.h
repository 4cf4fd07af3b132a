/*
 * zs_service_shm.h - the shared-memory data plane's part of the Shard
 * handlers (zs_service_shm.c), called by zs_service.c: Hello's two fields,
 * a Push chunk whose gradients lie in the worker's segment, a Pull that
 * writes into it. docs/protocol.md, "Shared-memory data plane".
 *
 * Internal to the service (zs__ names); zs-server installs the sessions
 * with zs_service_set_shm (zs_service.h).
 */
#ifndef ZS_SERVICE_SHM_H
#define ZS_SERVICE_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "zs_rpc.h"
#include "zs_shard.h"

/* Hello's shm_socket (the socket's absolute path, or "" when none is
 * offered), shm_session_ok (session != 0 is a live session here) and
 * shm_chunk_bytes (ZS_RPC_MAX_SHM_CHUNK_BYTES where a socket is offered,
 * else 0). */
void zs__svc_shm_hello(uint64_t session, char **socket, protobuf_c_boolean *ok,
                       uint32_t *chunk_bytes);

/* Validate a PushChunk that carries m->shm, before anything else of it is
 * used: no `data` beside it (pay_len 0), a known dtype, count 1..the chunk
 * limit (ZS_RPC_MAX_SHM_CHUNK_BYTES: no payload crosses gRPC). INVALID. */
int zs__svc_shm_push_check(const Zeroshard__PushChunk *m, size_t pay_len, zs_err_t *err);

/* Stage the chunk m (checked by zs__svc_shm_push_check) into the stream ps
 * from the worker's segment: the session must be live (FAILED_PRECONDITION),
 * the bytes inside its staging area and aligned to the element (OUT_OF_RANGE,
 * INVALID); they are copied where zs_shard_push_chunk says, then the copy is
 * checked against m->shm->xxh3 when has_xxh3 (DATA_LOSS; the stream is
 * then refused and its end undoes the copy, as for any refused chunk).
 * Adds the payload bytes to *bytes. */
int zs__svc_shm_push(zs_shard_push_t *ps, const Zeroshard__PushChunk *m, uint64_t *bytes,
                     zs_err_t *err);

/* A Pull whose request carried `shm` (the range already checked). */
typedef struct zs__shm_pull {
    uint64_t min_step, offset, count;
    zs_dtype_t dtype;
    size_t chunk_bytes;  /* validated 4096..ZS_RPC_MAX_PULL_CHUNK_BYTES */
    int64_t deadline_ms; /* zs_now_ms clock */
    Zeroshard__ShmRef ref;
} zs__shm_pull_t;

/* Serve it: check the whole destination against the session's staging
 * area first, then per chunk wait and convert straight into the segment
 * and send a PullChunk without data that says where it wrote (and its
 * XXH3 when asked). No send buffers, so nothing is reserved against the
 * budget. Finishes the call on ZS_OK; a worker exiting mid-pull ends it
 * with UNAVAILABLE. */
int zs__svc_shm_pull(zs_shard_t *sh, zs_scall_t *call, const zs__shm_pull_t *p, zs_err_t *err);

#endif
