/*
 * zs_client_internal.h - what the two halves of the shard client share:
 * the handle and the parallel fan-out with retries. zs_client.c: lifecycle,
 * Hello, Initialize, Push, Commit, Pull, state and checkpoint calls;
 * zs_client_xfer.c: the operator's calls (checkpoint metadata without a
 * Restore, streamed Initialize / SetState of one server).
 * Not part of the contract (zs_client.h).
 */
#ifndef ZS_CLIENT_INTERNAL_H
#define ZS_CLIENT_INTERNAL_H

#include <grpc/grpc.h>

#include "zs_client.h"
#include "zs_rpc.h"

#define ZS__CLIENT_MAX_ADDR 256

struct zs_client {
    int n;
    char (*addr)[ZS__CLIENT_MAX_ADDR];
    grpc_channel **ch;
    char *token;
    int timeout_ms, retries;
    uint64_t P;
    /* [n] protocol version negotiated with each server at Hello or before
     * Initialize (0: not asked yet); written by that server's fan-out job */
    uint32_t *ver;
    int warned; /* the warning about an older server was logged */
};

/* One attempt of an operation on server `server`. */
typedef int (*zs__client_attempt_fn)(zs_client_t *c, int server, void *arg, zs_err_t *err);

/* Run fn on servers [first, last] in parallel, each retried on UNAVAILABLE
 * (args[i - first] is each one's argument, or `shared` for all). Returns
 * the first error, in server order. */
int zs__client_fan_out(zs_client_t *c, int first, int last, zs__client_attempt_fn fn, void **args,
                       void *shared, zs_err_t *err);

/* First element of server i's range (i == n: P). Needs P known. */
uint64_t zs__client_srv_begin(const zs_client_t *c, int i);

/* Initialize's request to server i of c (protocol version: the negotiated
 * one once known, else ours; model name, P =
 * c->P, server count and index, AdamW, start step, overwrite) into *q, with
 * *adam as its AdamConfig: both must outlive the stream that sends *q.
 * model is borrowed, not copied. */
void zs__client_init_request(const zs_client_t *c, int i, const char *model,
                             const zs_adam_hparams_t *hp, uint64_t start_step, int overwrite,
                             Zeroshard__InitRequest *q, Zeroshard__AdamConfig *adam);

/* Learn the protocol version server i speaks (a Hello without identity
 * check) unless it is known: before an Initialize, whose request states it.
 * Returns the Hello's status. */
int zs__client_negotiate(zs_client_t *c, int i, zs_err_t *err);

/* End a client stream whose sends returned rc: take the reply (discarded)
 * and the status unless rc already failed, then destroy the call. Returns
 * rc, or the reply's / status's error. */
int zs__client_stream_end(zs_ccall_t *call, int rc, zs_err_t *err);

#endif
