/*
 * emu_event.c - events of the CUDA emulator (tests/cuda_emu/): create,
 * record (re-recording semantics), query, synchronize, elapsed time, and
 * cudaStreamWaitEvent. An event's captured state is a (stream, item
 * sequence number) pair of emu_stream.c's work queues.
 *
 * Does not: IPC events, cudaEventBlockingSync's sleeping wait (every wait
 * blocks on a condition variable anyway), external waits.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_core.h"

#define EVENT_MAGIC 0x5a457674u

typedef struct zs_emu_event {
    uint32_t magic;
    unsigned flags;
    int device, destroyed;
    zs_emu_stream *st; /* most recent record, NULL if never recorded */
    uint64_t seq;
    double time_ms; /* when the most recent record ran */
    struct zs_emu_event *next_all;
} zs_emu_event;

static zs_emu_event *g_events; /* all events ever made; never freed */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- Events (CUDA Runtime API, 6.6 Event Management) ---- */

static zs_emu_event *event_get(cudaEvent_t e)
{
    zs_emu_event *r = NULL;
    zs_emu_lock();
    for (zs_emu_event *x = g_events; x; x = x->next_all)
        if (x == (zs_emu_event *)e && x->magic == EVENT_MAGIC && !x->destroyed)
            r = x;
    zs_emu_unlock();
    return r;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    zs_emu_api_enter("cudaEventCreateWithFlags");
    unsigned ok = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!event || (flags & ~ok))
        return zs_emu_ret(cudaErrorInvalidValue);
    /* cudaEventCreateWithFlags: cudaEventInterprocess requires
     * cudaEventDisableTiming. */
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return zs_emu_ret(cudaErrorInvalidValue);
    zs_emu_lock();
    zs_emu_event *ev = NULL;
    /* Reuse a destroyed event whose last record has completed: destroying
     * an event with pending work releases it once that work is done
     * (cudaEventDestroy). */
    for (zs_emu_event *x = g_events; x; x = x->next_all)
        if (x->destroyed && (!x->st || zs_emu_stream_done_seq(x->st) >= x->seq)) {
            ev = x;
            break;
        }
    if (!ev) {
        ev = calloc(1, sizeof *ev);
        if (!ev) {
            zs_emu_unlock();
            return zs_emu_ret(cudaErrorMemoryAllocation);
        }
        ev->next_all = g_events;
        g_events = ev;
    }
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    ev->device = zs_emu_current_device();
    ev->destroyed = 0;
    ev->st = NULL;
    ev->seq = 0;
    zs_emu_unlock();
    *event = (cudaEvent_t)ev;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    zs_emu_api_enter("cudaEventDestroy");
    zs_emu_event *ev = event_get(event);
    if (!ev)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    zs_emu_lock();
    ev->destroyed = 1;
    zs_emu_unlock();
    return cudaSuccess;
}

typedef struct record_arg {
    zs_emu_event *ev;
    zs_emu_stream *st;
    uint64_t seq;
} record_arg;

static cudaError_t record_ran(void *p)
{
    record_arg *r = p;
    zs_emu_lock();
    /* Only the most recent record sets the time (re-recording overwrites
     * the captured state: cudaEventRecord). */
    if (r->ev->st == r->st && r->ev->seq == r->seq)
        r->ev->time_ms = now_ms();
    zs_emu_unlock();
    return cudaSuccess;
}

/* Stream lock held, before the record item can run or be freed. */
static void record_publish(void *p, uint64_t seq)
{
    record_arg *r = p;
    r->seq = seq;
    r->ev->st = r->st;
    r->ev->seq = seq;
}

/* cudaEventRecord: "Captures in event the contents of stream at the time of
 * this call." It "can be called multiple times on the same event and will
 * overwrite the previously captured state. Other APIs such as
 * cudaStreamWaitEvent() use the most recently captured state at the time of
 * the API call, and are not affected by later calls to cudaEventRecord()."
 * Event and stream must belong to the same device. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    zs_emu_api_enter("cudaEventRecord");
    zs_emu_event *ev = event_get(event);
    zs_emu_stream *st = zs_emu_stream_get(stream);
    if (!ev || !st || ev->device != zs_emu_stream_device(st))
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    record_arg *r = malloc(sizeof *r);
    if (!r)
        return zs_emu_ret(cudaErrorMemoryAllocation);
    r->ev = ev;
    r->st = st;
    if (!zs_emu_stream_push_ex(st, 0, -1, record_ran, r, free, NULL, record_publish, r))
        return zs_emu_ret(zs_emu_sticky(zs_emu_stream_device(st)));
    return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    if (flags)
        return zs_emu_ret(cudaErrorInvalidValue);
    return cudaEventRecord(event, stream);
}

/* cudaEventQuery: cudaSuccess if all work captured by the most recent
 * cudaEventRecord has completed (or if the event was never recorded),
 * cudaErrorNotReady if not. As with cudaStreamQuery, "not ready" is also
 * recorded as the thread's last error (hostile reading). */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    zs_emu_api_enter("cudaEventQuery");
    zs_emu_event *ev = event_get(event);
    if (!ev)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = zs_emu_sticky(ev->device);
    if (e != cudaSuccess)
        return zs_emu_ret(e);
    zs_emu_lock();
    int busy = ev->st && zs_emu_stream_done_seq(ev->st) < ev->seq;
    zs_emu_unlock();
    return busy ? zs_emu_ret(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    zs_emu_api_enter("cudaEventSynchronize");
    zs_emu_event *ev = event_get(event);
    if (!ev)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    zs_emu_lock();
    zs_emu_stream *st = ev->st;
    uint64_t seq = ev->seq;
    zs_emu_unlock();
    if (st)
        zs_emu_stream_wait(st, seq);
    return zs_emu_ret(zs_emu_sticky(ev->device));
}

/* cudaEventElapsedTime: both events recorded and completed, neither
 * created with cudaEventDisableTiming. Wall-clock time of the emulator:
 * meaningless as a GPU timing. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    zs_emu_api_enter("cudaEventElapsedTime");
    zs_emu_event *a = event_get(start), *b = event_get(end);
    if (!ms)
        return zs_emu_ret(cudaErrorInvalidValue);
    if (!a || !b || !a->st || !b->st || ((a->flags | b->flags) & cudaEventDisableTiming))
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    zs_emu_lock();
    int busy = zs_emu_stream_done_seq(a->st) < a->seq || zs_emu_stream_done_seq(b->st) < b->seq;
    float v = (float)(b->time_ms - a->time_ms);
    zs_emu_unlock();
    if (busy)
        return zs_emu_ret(cudaErrorNotReady);
    *ms = v;
    return cudaSuccess;
}

/* cudaStreamWaitEvent: "Makes all future work submitted to stream wait for
 * all work captured in event", using the state captured at the time of
 * this call; an event never recorded makes it a no-op. The event may belong
 * to another device. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    zs_emu_api_enter("cudaStreamWaitEvent");
    zs_emu_stream *st = zs_emu_stream_get(stream);
    zs_emu_event *ev = event_get(event);
    if (!st || !ev)
        return zs_emu_ret(cudaErrorInvalidResourceHandle);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return zs_emu_ret(cudaErrorInvalidValue);
    zs_emu_lock();
    zs_emu_dep d = {ev->st, ev->seq};
    zs_emu_unlock();
    if (!zs_emu_stream_push_ex(st, 0, -1, NULL, NULL, NULL, d.st ? &d : NULL, NULL, NULL))
        return zs_emu_ret(zs_emu_sticky(zs_emu_stream_device(st)));
    return cudaSuccess;
}
