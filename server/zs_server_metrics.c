/*
 * zs_server_metrics.c - zs-server's metrics, copied at each scrape from the
 * shard's and the RPC server's own counters (see zs_server_metrics.h; every
 * name is defined in docs/metrics.md).
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_server_metrics.h"
#include "zs_service.h"

/* gRPC's canonical status code names, by value. */
static const char *const k_codes[ZS_RPC_NCODES] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

/* Families; the enum indexes k_defs and sm->f. */
enum {
    M_INFO,
    M_CALLS,
    M_IN_FLIGHT,
    M_RECV,
    M_SENT,
    M_STEP,
    M_OPT_STEP,
    M_APPLIED,
    M_SKIPPED,
    M_OPT_SEC,
    M_OPT_BYTES,
    M_OPT_LAST,
    M_OPT_TPUT,
    M_CK_WRITTEN,
    M_CK_SEC,
    M_CK_BYTES,
    M_CK_LAST,
    M_CK_TPUT,
    M_CK_TIME,
    M_CK_AGE,
    M_CK_COUNT,
    M_CK_NEWEST,
    M_DEGRADED,
    M_INIT,
    M_PARAMS,
    M_BUDGET,
    M_RESERVED,
    M_HEAP,
    M_SPEC_HITS,
    M_SPEC_ROLLBACKS,
    M_SPEC_ELEMS,
    M_SPEC_SEC,
    M_NVME_READ,
    M_NVME_WRITTEN,
    M_NVME_PASSES,
    M_NVME_PASS_SEC,
    M_NVME_WAIT_SEC,
    M_N
};

static const struct {
    const char *name;
    zs_metric_type_t type;
    const char *help;
    const char *labels[2];
} k_defs[M_N] = {
    [M_INFO] = {"zs_server_info",
                ZS_METRIC_GAUGE,
                "Always 1; labels name the server and the protocol version it speaks.",
                {"server_id", "protocol_version"}},
    [M_CALLS] = {"zs_server_calls_total",
                 ZS_METRIC_COUNTER,
                 "Calls answered, by method and gRPC status code sent (refusals: code other "
                 "than OK; method unknown for methods the server does not have).",
                 {"method", "code"}},
    [M_IN_FLIGHT] = {"zs_server_calls_in_flight", ZS_METRIC_GAUGE,
                     "Calls being handled now (each holds one of --max-calls)."},
    [M_RECV] = {"zs_server_received_bytes_total", ZS_METRIC_COUNTER,
                "Tensor payload bytes received (Initialize, Push, SetState)."},
    [M_SENT] = {"zs_server_sent_bytes_total", ZS_METRIC_COUNTER,
                "Tensor payload bytes sent (Pull, GetState)."},
    [M_STEP] = {"zs_server_step", ZS_METRIC_GAUGE, "Last committed training step (applied_step)."},
    [M_OPT_STEP] = {"zs_server_optimizer_step", ZS_METRIC_GAUGE,
                    "Adam's t: committed steps that were not skipped."},
    [M_APPLIED] = {"zs_server_steps_applied_total", ZS_METRIC_COUNTER,
                   "Optimizer passes run since start."},
    [M_SKIPPED] = {"zs_server_steps_skipped_total", ZS_METRIC_COUNTER,
                   "Committed steps skipped (fp16 overflow) since start."},
    [M_OPT_SEC] = {"zs_server_optimizer_seconds_total", ZS_METRIC_COUNTER,
                   "Seconds spent in optimizer passes since start."},
    [M_OPT_BYTES] = {"zs_server_optimizer_bytes_total", ZS_METRIC_COUNTER,
                     "State bytes the optimizer streamed since start (28 per element and "
                     "step); rate over zs_server_optimizer_seconds_total is its throughput."},
    [M_OPT_LAST] = {"zs_server_optimizer_last_step_seconds", ZS_METRIC_GAUGE,
                    "Duration of the last optimizer pass in seconds."},
    [M_OPT_TPUT] = {"zs_server_optimizer_throughput_bytes_per_second", ZS_METRIC_GAUGE,
                    "State bytes per second of the last optimizer pass."},
    [M_CK_WRITTEN] = {"zs_server_checkpoints_written_total", ZS_METRIC_COUNTER,
                      "Checkpoints written durably since start."},
    [M_CK_SEC] = {"zs_server_checkpoint_seconds_total", ZS_METRIC_COUNTER,
                  "Seconds spent writing checkpoints since start."},
    [M_CK_BYTES] = {"zs_server_checkpoint_bytes_total", ZS_METRIC_COUNTER,
                    "State bytes written to checkpoints since start (12 per element)."},
    [M_CK_LAST] = {"zs_server_checkpoint_last_duration_seconds", ZS_METRIC_GAUGE,
                   "Duration of the newest checkpoint write in seconds."},
    [M_CK_TPUT] = {"zs_server_checkpoint_throughput_bytes_per_second", ZS_METRIC_GAUGE,
                   "State bytes per second of the newest checkpoint write."},
    [M_CK_TIME] = {"zs_server_checkpoint_last_timestamp_seconds", ZS_METRIC_GAUGE,
                   "Unix time the newest checkpoint written since start became durable "
                   "(absent before the first)."},
    [M_CK_AGE] = {"zs_server_checkpoint_age_seconds", ZS_METRIC_GAUGE,
                  "Seconds since the newest checkpoint written since start became durable "
                  "(absent before the first)."},
    [M_CK_COUNT] = {"zs_server_checkpoints", ZS_METRIC_GAUGE, "Complete checkpoints in the store."},
    [M_CK_NEWEST] = {"zs_server_checkpoint_newest_step", ZS_METRIC_GAUGE,
                     "Step of the newest complete checkpoint in the store (0 when there is none)."},
    [M_DEGRADED] = {"zs_server_store_degraded", ZS_METRIC_GAUGE,
                    "1 when the store's last write failed (e.g. disk full), else 0."},
    [M_INIT] = {"zs_server_initialized", ZS_METRIC_GAUGE, "1 once the server holds a model."},
    [M_PARAMS] = {"zs_server_owned_parameters", ZS_METRIC_GAUGE,
                  "Elements of the flat parameter space this server owns."},
    [M_BUDGET] = {"zs_server_memory_budget_bytes", ZS_METRIC_GAUGE,
                  "Memory budget requests are held to (--mem-budget) in bytes."},
    [M_RESERVED] = {"zs_server_memory_reserved_bytes",
                    ZS_METRIC_GAUGE,
                    "Bytes reserved against the budget, by category: state (the installed "
                    "model state), preimages (speculation pre-images, --spec-window) and "
                    "requests (states being built, staging records, per-call buffers).",
                    {"category"}},
    [M_HEAP] = {"zs_server_heap_bytes",
                ZS_METRIC_GAUGE,
                "The C allocator's heap (glibc mallinfo2) in bytes, by state: in_use, "
                "free (kept for reuse).",
                {"state"}},
    [M_SPEC_HITS] = {"zs_server_speculation_hits_total", ZS_METRIC_COUNTER,
                     "Commits that kept the speculative update of their step (the scalars the "
                     "workers stated were the real ones)."},
    [M_SPEC_ROLLBACKS] = {"zs_server_speculation_rollbacks_total", ZS_METRIC_COUNTER,
                          "Steps whose speculative update was restored from its pre-images "
                          "(clipping, another loss scale, an overflow-skipped step, or a "
                          "checkpoint/GetState/SetState before the commit)."},
    [M_SPEC_ELEMS] = {"zs_server_speculation_elements_total", ZS_METRIC_COUNTER,
                      "Elements updated speculatively, before their step's commit."},
    [M_SPEC_SEC] = {"zs_server_speculation_seconds_total", ZS_METRIC_COUNTER,
                    "Seconds spent on speculative updates (pre-image copies included); "
                    "overlapped with the workers' backward, not on their critical path."},
    [M_NVME_READ] = {"zs_server_nvme_read_bytes_total", ZS_METRIC_COUNTER,
                     "Bytes read from the NVMe tier's file (--nvme-path) since start: tiles, "
                     "staged gradients, headers; 0 without the tier."},
    [M_NVME_WRITTEN] = {"zs_server_nvme_written_bytes_total",
                        ZS_METRIC_COUNTER,
                        "Bytes written to the NVMe tier's file since start, by kind: gradients "
                        "(pushed gradients staged on the drive) and tiles (everything else: "
                        "passes, Initialize, Restore, SetState); 0 without the tier.",
                        {"kind"}},
    [M_NVME_PASSES] =
        {"zs_server_nvme_passes_total", ZS_METRIC_COUNTER,
         "Optimizer passes over the NVMe tier's tiles since start; 0 without the tier."},
    [M_NVME_PASS_SEC] = {"zs_server_nvme_pass_seconds_total", ZS_METRIC_COUNTER,
                         "Seconds spent in passes over the NVMe tier since start; 0 without "
                         "the tier."},
    [M_NVME_WAIT_SEC] = {"zs_server_nvme_io_wait_seconds_total", ZS_METRIC_COUNTER,
                         "Seconds those passes waited for I/O with nothing to update (the pass "
                         "is I/O-bound when this is close to the pass seconds)."},
};

struct zs_server_metrics {
    zs_metrics_t *reg;
    zs_metric_t *f[M_N];
    zs_shard_t *sh;
    zs_rpc_server_t *srv;
    const zs_rpc_method_t *methods;
    int nmethods;
    uint64_t *answered; /* (nmethods + 1) * ZS_RPC_NCODES */
};

/* "/zeroshard.Shard/Push" -> "Push" */
static const char *method_label(const zs_server_metrics_t *sm, int m)
{
    if (m >= sm->nmethods)
        return "unknown";
    const char *slash = strrchr(sm->methods[m].path, '/');
    return slash ? slash + 1 : sm->methods[m].path;
}

static void set0(zs_server_metrics_t *sm, int k, double v)
{
    zs_metric_set(sm->f[k], NULL, v);
}

static void set1(zs_server_metrics_t *sm, int k, const char *label, double v)
{
    const char *vals[1] = {label};
    zs_metric_set(sm->f[k], vals, v);
}

/* The scrape function: copy every value from its source. */
static void collect(void *ud)
{
    zs_server_metrics_t *sm = ud;
    zs_rpc_server_answered(sm->srv, sm->answered);
    for (int m = 0; m <= sm->nmethods; m++) {
        for (int c = 0; c < ZS_RPC_NCODES; c++) {
            uint64_t n = sm->answered[(size_t)m * ZS_RPC_NCODES + (size_t)c];
            /* OK of every method from the start, other codes once seen */
            if (n || (c == 0 && m < sm->nmethods)) {
                const char *vals[2] = {method_label(sm, m), k_codes[c]};
                zs_metric_set(sm->f[M_CALLS], vals, (double)n);
            }
        }
    }
    set0(sm, M_IN_FLIGHT, zs_rpc_server_active(sm->srv));

    zs_shard_info_t in;
    zs_err_t err;
    if (zs_shard_info(sm->sh, &in, &err) == ZS_OK) {
        const zs_shard_counters_t *c = &in.counters;
        set0(sm, M_RECV, (double)c->bytes_in);
        set0(sm, M_SENT, (double)c->bytes_out);
        set0(sm, M_STEP, (double)in.applied_step);
        set0(sm, M_OPT_STEP, (double)in.optimizer_step);
        set0(sm, M_APPLIED, (double)c->steps_applied);
        set0(sm, M_SKIPPED, (double)c->steps_skipped);
        set0(sm, M_OPT_SEC, c->optimizer_seconds);
        set0(sm, M_OPT_BYTES, (double)c->optimizer_bytes);
        set0(sm, M_OPT_LAST, c->last_step_ms / 1e3);
        set0(sm, M_OPT_TPUT, c->optimizer_gbps * 1e9);
        set0(sm, M_CK_WRITTEN, (double)c->checkpoints_written);
        set0(sm, M_CK_SEC, c->checkpoint_seconds);
        set0(sm, M_CK_BYTES, (double)c->checkpoint_bytes);
        set0(sm, M_CK_LAST, c->last_checkpoint_seconds);
        set0(sm, M_CK_TPUT, c->checkpoint_gbps * 1e9);
        if (c->last_checkpoint_time > 0) {
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            double t = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
            set0(sm, M_CK_TIME, c->last_checkpoint_time);
            set0(sm, M_CK_AGE, t > c->last_checkpoint_time ? t - c->last_checkpoint_time : 0);
        }
        set0(sm, M_CK_COUNT, (double)in.ncheckpoints);
        set0(sm, M_CK_NEWEST, in.ncheckpoints ? (double)in.checkpoints[in.ncheckpoints - 1] : 0);
        set0(sm, M_DEGRADED, in.store_degraded ? 1 : 0);
        set0(sm, M_INIT, in.initialized ? 1 : 0);
        set0(sm, M_PARAMS, (double)(in.range_end - in.range_begin));
        set0(sm, M_BUDGET, (double)in.mem_budget);
        uint64_t state = in.mem_state < in.mem_reserved ? in.mem_state : in.mem_reserved;
        uint64_t pre = c->spec_window_bytes < in.mem_reserved - state ? c->spec_window_bytes
                                                                      : in.mem_reserved - state;
        set1(sm, M_RESERVED, "state", (double)state);
        set1(sm, M_RESERVED, "preimages", (double)pre);
        set1(sm, M_RESERVED, "requests", (double)(in.mem_reserved - state - pre));
        set0(sm, M_SPEC_HITS, (double)c->spec_hits);
        set0(sm, M_SPEC_ROLLBACKS, (double)c->spec_rollbacks);
        set0(sm, M_SPEC_ELEMS, (double)c->spec_elements);
        set0(sm, M_SPEC_SEC, c->spec_seconds);
        /* 0 without the tier (served, so one set of names fits every server) */
        set0(sm, M_NVME_READ, (double)c->nvme_read_bytes);
        set1(sm, M_NVME_WRITTEN, "gradients", (double)c->nvme_grad_written_bytes);
        set1(sm, M_NVME_WRITTEN, "tiles",
             (double)(c->nvme_written_bytes - c->nvme_grad_written_bytes));
        set0(sm, M_NVME_PASSES, (double)c->nvme_passes);
        set0(sm, M_NVME_PASS_SEC, c->nvme_pass_seconds);
        set0(sm, M_NVME_WAIT_SEC, c->nvme_io_wait_seconds);
        free(in.checkpoints);
    }
    struct mallinfo2 mi = mallinfo2();
    set1(sm, M_HEAP, "in_use", (double)(mi.uordblks + mi.hblkhd));
    set1(sm, M_HEAP, "free", (double)mi.fordblks);
}

int zs_server_metrics_create(const char *hostport, zs_shard_t *sh, zs_rpc_server_t *srv,
                             const zs_rpc_method_t *methods, int nmethods, const char *server_id,
                             zs_server_metrics_t **out, zs_err_t *err)
{
    *out = NULL;
    zs_server_metrics_t *sm = calloc(1, sizeof *sm);
    if (!sm ||
        !(sm->answered = calloc((size_t)(nmethods + 1) * ZS_RPC_NCODES, sizeof *sm->answered))) {
        free(sm);
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    sm->sh = sh;
    sm->srv = srv;
    sm->methods = methods;
    sm->nmethods = nmethods;
    int rc = zs_metrics_create(&sm->reg, err);
    for (int k = 0; !rc && k < M_N; k++) {
        int nl = k_defs[k].labels[1] ? 2 : k_defs[k].labels[0] ? 1 : 0;
        rc = zs_metrics_add(sm->reg, k_defs[k].name, k_defs[k].type, k_defs[k].help, nl,
                            k_defs[k].labels, &sm->f[k], err);
    }
    if (!rc)
        rc = zs_metrics_add_process(sm->reg, "zs_server", err);
    if (!rc) {
        char proto[16];
        snprintf(proto, sizeof proto, "%u", zs_service_protocol_version());
        const char *vals[2] = {server_id ? server_id : "", proto};
        if (zs_metric_set(sm->f[M_INFO], vals, 1))
            rc = zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        zs_metrics_on_scrape(sm->reg, collect, sm);
        rc = zs_metrics_serve(sm->reg, hostport, err);
    }
    if (rc) {
        zs_server_metrics_destroy(sm);
        return rc;
    }
    *out = sm;
    return ZS_OK;
}

zs_metrics_t *zs_server_metrics_registry(zs_server_metrics_t *sm)
{
    return sm->reg;
}

void zs_server_metrics_destroy(zs_server_metrics_t *sm)
{
    if (!sm)
        return;
    zs_metrics_destroy(sm->reg);
    free(sm->answered);
    free(sm);
}
