/*
 * emu_nccl_group.c - the emulated NCCL's group calls and launches:
 * ncclGroupStart/End (per thread, nesting, launch at the outermost end),
 * and the launch of a group (or of one call, an implicit group) that a
 * non-blocking communicator may answer with ncclInProgress, holding the
 * ops back until ncclCommGetAsyncError settles.
 *
 * Does not: check a call's arguments (emu_nccl_coll.c) or run it
 * (emu_nccl_exec.c).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_nccl.h"

#define EXPORT_P(ret, name, params) ret p##name params __attribute__((alias(#name)));

/* Per thread, as NCCL's group state is ("Group Calls": group primitives
 * define the behaviour of the current thread). */
static _Thread_local struct {
    int depth;
    zs_emu_nccl_op *ops;
    int n, cap;
    ncclResult_t err;
} g_group;

int zs_emu_nccl_group_depth(void)
{
    return g_group.depth;
}

int zs_emu_nccl_group_has(struct ncclComm *c)
{
    for (int i = 0; i < g_group.n; i++)
        if (g_group.ops[i].comm == c)
            return 1;
    return 0;
}

void zs_emu_nccl_group_error(ncclResult_t rc)
{
    if (g_group.depth > 0 && g_group.err == ncclSuccess)
        g_group.err = rc;
}

void zs_emu_nccl_group_add(const zs_emu_nccl_op *op)
{
    struct ncclComm *c = op->comm;
    if (g_group.n == g_group.cap) {
        g_group.cap = g_group.cap ? 2 * g_group.cap : 64;
        g_group.ops = realloc(g_group.ops, (size_t)g_group.cap * sizeof *g_group.ops);
    }
    pthread_mutex_lock(&c->mu);
    c->refs++; /* the group's reference */
    pthread_mutex_unlock(&c->mu);
    g_group.ops[g_group.n++] = *op;
}

static void stash(struct ncclComm *c, const zs_emu_nccl_op *op)
{
    pthread_mutex_lock(&c->mu);
    if (c->nstash == c->capstash) {
        c->capstash = c->capstash ? 2 * c->capstash : 16;
        c->stash = realloc(c->stash, (size_t)c->capstash * sizeof(zs_emu_nccl_op));
    }
    ((zs_emu_nccl_op *)c->stash)[c->nstash++] = *op;
    pthread_mutex_unlock(&c->mu);
}

void zs_emu_nccl_flush_stash(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    zs_emu_nccl_op *ops = c->stash;
    int n = c->nstash;
    c->stash = NULL;
    c->nstash = c->capstash = 0;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) {
        if (atomic_load(&c->async_err) == ncclSuccess && !atomic_load(&c->aborted))
            zs_emu_nccl_launch(&ops[i]); /* takes ops[i].p2p */
        else
            zs_emu_nccl_p2p_free(&ops[i]); /* dropped (abort, error) */
        zs_emu_nccl_unref(c);              /* the stash's reference */
    }
    free(ops);
}

/* Launch a group (or one call: an implicit group). A non-blocking
 * communicator may answer ncclInProgress: its ops then launch only when
 * ncclCommGetAsyncError settles ("Non-blocking communicators": do not use
 * the streams until then; the hostile reading really holds them back). */
ncclResult_t zs_emu_nccl_launch_group(zs_emu_nccl_op *ops, int n)
{
    ncclResult_t ret = ncclSuccess;
    for (int i = 0; i < n; i++) {
        struct ncclComm *c = ops[i].comm;
        int stashed = c->nstash > 0;
        if (!c->blocking && !stashed) {
            int polls = zs_emu_nccl_draw_polls(c->rank);
            if (polls > 0) {
                pthread_mutex_lock(&c->mu);
                c->pending_polls = polls;
                pthread_mutex_unlock(&c->mu);
                stashed = 1;
            }
        }
        if (stashed) {
            pthread_mutex_lock(&c->mu);
            c->refs++;
            pthread_mutex_unlock(&c->mu);
            stash(c, &ops[i]);
            ret = ncclInProgress;
            continue;
        }
        ncclResult_t rc = zs_emu_nccl_launch(&ops[i]);
        if (rc != ncclSuccess && ret == ncclSuccess)
            ret = rc;
    }
    return ret;
}

ncclResult_t ncclGroupStart(void)
{
    g_group.depth++; /* groups nest ("Group Calls") */
    return ncclSuccess;
}
EXPORT_P(ncclResult_t, ncclGroupStart, (void))

ncclResult_t ncclGroupEnd(void)
{
    if (g_group.depth == 0) {
        zs_emu_nccl_set_last("cuda-emu nccl: ncclGroupEnd without ncclGroupStart");
        fprintf(stderr, "cuda-emu nccl: ncclGroupEnd without ncclGroupStart\n");
        return ncclInvalidUsage;
    }
    if (--g_group.depth > 0)
        return ncclSuccess; /* only the outermost end launches */
    zs_emu_nccl_op *ops = g_group.ops;
    int n = g_group.n;
    ncclResult_t err = g_group.err;
    g_group.ops = NULL;
    g_group.n = g_group.cap = 0;
    g_group.err = ncclSuccess;
    ncclResult_t rc = err;
    if (err == ncclSuccess) {
        /* A communicator destroyed or aborted while its calls sat in the
         * group: refuse the whole group. */
        for (int i = 0; i < n && rc == ncclSuccess; i++)
            if (ops[i].comm->magic != ZS_EMU_COMM_LIVE)
                rc = zs_emu_nccl_check(ops[i].comm, "ncclGroupEnd");
        if (rc == ncclSuccess) {
            /* "Point-to-point communication": the sends and receives of a
             * group progress together; they become one op per
             * communicator (emu_nccl_p2p.c), which the launch owns. */
            zs_emu_nccl_op *run = malloc((size_t)(n ? n : 1) * sizeof *run);
            int m = n;
            if (!run)
                rc = ncclSystemError;
            else {
                if (n) /* an empty group has ops == NULL */
                    memcpy(run, ops, (size_t)n * sizeof *run);
                rc = zs_emu_nccl_p2p_fold(run, &m);
                if (rc == ncclSuccess)
                    rc = zs_emu_nccl_launch_group(run, m);
                free(run);
            }
        }
    }
    /* Hostile: a group with a refused call launches none of its calls. */
    for (int i = 0; i < n; i++)
        zs_emu_nccl_unref(ops[i].comm);
    free(ops);
    return rc;
}
EXPORT_P(ncclResult_t, ncclGroupEnd, (void))
