/*
 * zs_ctl.h - what zs-ctl's commands share (tools/zs_ctl*.c):
 *   zs_ctl.c          main: status, checkpoints, checkpoint, restore,
 *                     delete; dispatch to the commands below
 *   zs_ctl_src.c      a checkpoint to read, held live by a set of servers
 *   zs_ctl_manifest.c the model manifest stored with a checkpoint
 *   zs_ctl_export.c   export: a checkpoint to one safetensors file
 *   zs_ctl_reshard.c  reshard: a checkpoint from S servers to S' servers
 *
 * Reading a checkpoint. The protocol reads tensors from a server's live
 * state (GetState), not from its store, and a checkpoint's metadata from
 * the store (GetCheckpointMeta). So export and reshard read checkpoint S
 * without a Restore when the servers hold exactly it: every server's
 * applied step and Adam t equal the checkpoint's, which is the case after
 * training stopped at (or resumed from) checkpoint S, or after a restart
 * of the servers (they load the newest complete checkpoint). Every chunk
 * read reports the server's step, and the servers are asked again at the
 * end: a state that moved while reading (a trainer is running) aborts the
 * command. Reading another checkpoint needs its state loaded: --restore
 * does that (Restore S), and only when the servers hold a complete
 * checkpoint themselves, which it restores back at the end; use it only
 * while no trainer runs.
 */
#ifndef ZS_CTL_H
#define ZS_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "zs_client.h"
#include "zs_engine.h"

/* Elements per read and write: 1 MiB of fp32, what one bulk message carries. */
#define ZS_CTL_CHUNK (256u * 1024u)

/* Connect to `servers` with the bearer token / CA read from the files (each
 * may be NULL). Prints why on failure. Returns 0 or 1. */
int zs_ctl_connect(const char *servers, const char *token_file, const char *ca_file,
                   zs_client_t **out);

/* A checkpoint whose state a set of servers holds live (see above). */
typedef struct zs_ctl_src {
    zs_client_t *c; /* not owned */
    int S;
    uint64_t P, step, adam_t;
    zs_ckpt_info_t *info; /* [S]: what each server stored with the checkpoint */
    uint8_t *meta;        /* the checkpoint's user_meta (engine state, manifest) */
    size_t meta_len;
    uint64_t restore_back; /* --restore: the checkpoint the servers held before (0: none) */
} zs_ctl_src_t;

/* Pick checkpoint `want` (0: the newest complete on every server) of the
 * servers of `c`, read its metadata without a Restore and check that the
 * servers hold it live. If they hold another step: with allow_restore,
 * Restore `want` when what they hold is itself a complete checkpoint
 * (remembered in restore_back), else refuse (ZS_ERR_STATE, saying what to
 * do). *s is freed with zs_ctl_src_close. */
int zs_ctl_src_open(zs_client_t *c, uint64_t want, int allow_restore, zs_ctl_src_t *s,
                    zs_err_t *err);

/* fp32 `tensor` (0 master, 1 exp_avg, 2 exp_avg_sq) of [b, e) into dst;
 * ZS_ERR_STATE if any chunk came from another step than the checkpoint's. */
int zs_ctl_src_read(zs_ctl_src_t *s, int tensor, uint64_t b, uint64_t e, float *dst, zs_err_t *err);

/* Check that the servers still hold the checkpoint (applied step, Adam t,
 * the checkpoint still complete): what was read is the checkpoint. */
int zs_ctl_src_verify(zs_ctl_src_t *s, zs_err_t *err);

/* Restore what the servers held before (restore_back), free *s. Returns
 * the restore's status (ZS_OK when there was none). */
int zs_ctl_src_close(zs_ctl_src_t *s, zs_err_t *err);

/* How export and reshard run on a source, start to end: start the clock;
 * before(ud) when not NULL (checks that must pass before the servers are
 * touched); open checkpoint `step` of c (zs_ctl_src_open, allow_restore =
 * restore); run(s, ud); close the source (its error counts when all else
 * succeeded). Prints "zs-ctl CMD: <error>" on failure, else "CMD: <seconds>
 * s, peak memory <MiB> MiB". Returns the exit status, 0 or 1. */
typedef int (*zs_ctl_before_fn)(void *ud, zs_err_t *err);
typedef int (*zs_ctl_run_fn)(zs_ctl_src_t *s, void *ud, zs_err_t *err);
int zs_ctl_src_run(const char *cmd, zs_client_t *c, uint64_t step, int restore,
                   zs_ctl_before_fn before, zs_ctl_run_fn run, void *ud);

/* --step of command `cmd`: a positive decimal into *step. Returns 0, or
 * prints why to stderr and returns 2 (the usage exit status). */
int zs_ctl_parse_step(const char *cmd, const char *arg, uint64_t *step);

/* ---- the model manifest (zs_ctl_manifest.c) ---- */

#define ZS_CTL_MAX_TENSORS 100000 /* far beyond any model's parameter tensors */
#define ZS_CTL_MAX_DIMS    8

/* One tensor of the manifest: elements [offset, offset + numel) of the flat
 * space, row-major with `shape`. */
typedef struct zs_ctl_tensor {
    char name[128]; /* [A-Za-z0-9_.:/-]+ */
    int ndim;
    uint64_t shape[ZS_CTL_MAX_DIMS];
    uint64_t offset, numel;
} zs_ctl_tensor_t;

typedef struct zs_ctl_manifest {
    char *model_json;   /* the "model" object (name, kind, config) as compact JSON */
    zs_ctl_tensor_t *t; /* [n], ascending offset, disjoint */
    int n;
} zs_ctl_manifest_t;

/* Parse and validate the manifest text (len bytes, from a checkpoint: trust
 * nothing) of a model of P parameters: the format, storage dtype F32,
 * num_params == P, every tensor's name (unique, <= 127 characters of
 * [A-Za-z0-9_.:/-]), shape (1..8 dims, each >= 1) and offset (integers,
 * inside [0, P)), no two tensors overlapping. *m freed with
 * zs_ctl_manifest_free. */
int zs_ctl_manifest_parse(const char *text, size_t len, uint64_t P, zs_ctl_manifest_t *m,
                          zs_err_t *err);
void zs_ctl_manifest_free(zs_ctl_manifest_t *m);

/* zs-ctl export / reshard: argv[0] is the program, the command word is
 * already removed; global options (--servers, --token-file, --tls-ca) may
 * be anywhere. Return the process exit status (0 ok, 1 failed, 2 usage). */
int zs_ctl_export_main(int argc, char **argv);
int zs_ctl_reshard_main(int argc, char **argv);

/* Peak resident memory of this process in MiB (getrusage). */
double zs_ctl_peak_rss_mib(void);

#endif
