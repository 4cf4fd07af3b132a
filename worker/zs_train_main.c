/*
 * zs_train_main.c - zs-train: train the reference GPT with the ZeRO engine
 * on GPU (CUDA + NCCL) or CPU (MPI) workers under MPI, optimizer on shard
 * servers or in-process.
 *
 *   mpirun -np N zs-train --data F.tok [--device auto|cpu|cuda]
 *          [--config ds.json] [--servers a:p,b:p]
 *          [--layers 4 --heads 4 --width 256 --ctx 64] [--steps 200]
 *          [--ckpt-every 50] [--resume | --resume-auto] [--csv F] [--log-every 1]
 *          [--mem-every K] [--server-timeout S] [--server-wait S]
 *          [--max-recoveries N] [--save-params F] [--metrics HOST:PORT]
 *          [--print-config] [--vocab-dir DIR] [--transport auto|shm|tcp]
 *
 * Rank 0 prints one line for the resolved configuration (its XXH3-64
 * digest and the keys that differ from DeepSpeed's defaults,
 * zs_config_summary; the whole table with --print-config, and with --csv F
 * always into F.config.txt: a fresh run starts it, a resume appends its
 * own), the model size, one progress
 * line per step (or every K), the memory table of every worker after step 1
 * (measured by the device allocator, beside the ZeRO formula and the
 * working set the configuration allows; and every --mem-every steps), and a
 * summary; it
 * writes the same figures as CSV (deploy/plot.sh turns them into a PNG),
 * and with --metrics serves them to Prometheus (zs_train_metrics.h).
 * Without --config an embedded default is used (ZeRO stage 2, AdamW, the
 * optimizer offloaded when --servers is given).
 *
 * Device (--device, default auto): cuda puts each rank on one GPU, chosen by
 * its node-local rank (cuda:<local rank>, or cuda:0 when each rank sees one
 * GPU through CUDA_VISIBLE_DEVICES), with NCCL collectives; cpu uses the CPU
 * device and MPI collectives; auto is cuda when every rank has a GPU of its
 * own (a node shows at least as many GPUs as it runs ranks), else cpu, and
 * rank 0 says which and why. The ranks agree on the choice before anything
 * starts: --device cuda where any rank has no usable GPU is one error line
 * and exit code 6 on every rank. On CUDA the memory table is followed by
 * each rank's device memory as cudaMemGetInfo counts it.
 *
 * A lost shard server does not end the run: the step fails on every worker,
 * the engine waits for the server to come back on its address (up to
 * --server-wait), restores the newest checkpoint complete on every server
 * and goes on from there (zs_engine_recover), at most --max-recoveries
 * times. A lost worker ends mpirun; zs-launch reruns the job with
 * --resume-auto. The CSV never holds a step twice: on resume and recovery
 * rows after the step resumed at are dropped.
 *
 * Before anything starts, every rank parses the command line, the config
 * and the token file and opens the data; the ranks then agree on the
 * outcome, so a mistake there is printed once (by rank 0, or by the lowest
 * rank that failed) and every rank exits through MPI_Finalize with the same
 * code, without MPI_Abort. Failures after that (engine, servers, a step) may
 * hit some ranks only and abort the job with their code. Exit codes
 * (usage(), README): 0 done, 1 other failure, 2 command line, 3 config,
 * 4 data, 5 engine or shard servers, 6 no usable GPU for --device cuda (or
 * the CUDA device / NCCL communicator could not be set up).
 */
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zs_client.h"
#include "zs_config.h"
#include "zs_data.h"
#include "zs_engine.h"
#include "zs_file.h"
#include "zs_gpt.h"
#include "zs_init_from.h"
#include "zs_log.h"
#include "zs_gpt_eval.h"
#include "zs_train_device.h"
#include "zs_train_opts.h"
#include "zs_train_metrics.h"
#if defined(ZS_WITH_CUDA) && defined(ZS_WITH_NCCL)
#include "zs_coll_nccl.h"
#include "zs_dev_cuda.h"
#define ZS_TRAIN_CUDA 1 /* --device cuda can work in this build */
#endif

static const char *k_default_config =
    "{\n"
    "  \"train_batch_size\": 16,\n"
    "  \"train_micro_batch_size_per_gpu\": 4,\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, 0.95],\n"
    "                \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
    "  \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,\n"
    "                \"warmup_max_lr\": 0.001, \"warmup_num_steps\": 20,\n"
    "                \"warmup_type\": \"linear\"}},\n"
    "  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"%s\"}}\n"
    "}\n";

/* Config warnings, printed by rank 0 only (every rank parses the same file). */
static void warn_key(void *ud, const char *path, const char *why)
{
    if (*(int *)ud == 0)
        fprintf(stderr, "zs-train: warning: config key %s: %s\n", path, why);
}

/* Open the CSV for rank 0. On a resume (at > 0) keep the header and the
 * rows of steps <= at, so a step is never listed twice; a fresh run starts
 * the file. NULL (with a message) on failure. */
static FILE *csv_open(const char *path, int resumed, uint64_t at)
{
    static const char *header = "step,loss,lr,loss_scale,tokens_per_s,ms_step,ms_forward,"
                                "ms_backward,ms_comm,ms_optimizer,skipped,workers,val_loss,spec,"
                                "ms_opt_push,ms_opt_commit,ms_opt_pull,bytes_intra,bytes_inter,"
                                "bwd_gather_bytes_inter\n";
    char *old = resumed ? zs_file_read_text(path, (size_t)1 << 30, 0) : NULL;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "zs-train: cannot write %s\n", path);
        free(old);
        return NULL;
    }
    fputs(header, f);
    /* old: the header line, then one row per step ("step,loss,..."). */
    char *line = old ? strchr(old, '\n') : NULL;
    while (line && *++line) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        unsigned long long step = strtoull(line, NULL, 10);
        if (step >= 1 && step <= at)
            fprintf(f, "%.*s\n", (int)len, line);
        line = end;
    }
    free(old);
    fflush(f);
    return f;
}

/* Rank 0 writes the resolved configuration's table to path (--csv's
 * F.config.txt): a fresh run starts the file, a resumed one appends its
 * own after a line saying at which step and with how many workers, so the
 * file holds the configuration of every start that wrote rows to the CSV.
 * 0, or -1 with a message. */
static int config_table(const char *path, const zs_config_t *cfg, int W, int resumed,
                        uint64_t start)
{
    FILE *f = fopen(path, resumed ? "a" : "w");
    if (f) {
        fprintf(f, "# zs-train %s at step %llu, %d workers: config %016llx\n",
                resumed ? "resumed" : "started", (unsigned long long)start, W,
                (unsigned long long)zs_config_digest(cfg));
        zs_config_print(cfg, f);
    }
    if (!f || fclose(f) != 0) {
        fprintf(stderr, "zs-train: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* A failure after the start, possibly on some ranks only: print it and
 * abort the job with `code` (mpirun exits with it). */
static int die(int rank, const char *what, const zs_err_t *err, int code)
{
    fprintf(stderr, "zs-train: rank %d: %s: %s\n", rank, what, err->msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    return code;
}

/* The checks every rank makes before anything starts: the config (parsed
 * and resolved for W), the token file, the data. Returns 0, or the exit
 * code with *what and *err saying what failed. *token is malloc'd (caller
 * frees), *data opened (caller closes), also on failure. */
static int preflight(const zs__train_opts_t *o, int rank, int W, zs_config_t *cfg, char **token,
                     zs_data_t **data, const char **what, zs_err_t *err)
{
    char json[2048];
    zs_config_opts_t co = {warn_key, &rank, o->allow_unknown};
    int rc;
    if (o->config) {
        rc = zs_config_load_opts(o->config, &co, cfg, err);
    } else {
        snprintf(json, sizeof json, k_default_config, o->servers ? "cpu" : "none");
        rc = zs_config_parse_opts(json, &co, cfg, err);
    }
    if (!rc)
        rc = zs_config_resolve(cfg, W, err);
    if (rc) {
        *what = "config";
        return ZS_EXIT_CONFIG;
    }
    if (o->token_file && !(*token = zs_file_read_text(o->token_file, 4096, 1))) {
        *what = "usage";
        zs_err_set(err, ZS_ERR_IO, "cannot read --token-file %s", o->token_file);
        return ZS_EXIT_USAGE;
    }
    if (zs_data_open(o->data, data, err)) {
        *what = "data";
        return ZS_EXIT_DATA;
    }
    return 0;
}

/* --init-from: open the weights file and settle the model shape from it
 * (zs_init_from_settle). 0, or ZS_EXIT_DATA (unreadable or not GPT-2
 * weights) / ZS_EXIT_USAGE (a shape flag or the data's vocab disagrees)
 * with *what and *err set. */
static int init_from_open(zs__train_opts_t *o, const zs_data_t *data, zs_init_from_t **f,
                          const char **what, zs_err_t *err)
{
    *what = "--init-from";
    if (zs_init_from_load(o->init_from, f, err))
        return ZS_EXIT_DATA;
    if (zs_init_from_settle(*f, &o->g, o->given_l, o->given_c, o->given_h, o->given_t,
                            zs_data_vocab(data), err))
        return ZS_EXIT_USAGE;
    return 0;
}

/* --val-data and --sample-every: the evaluator (zs_gpt_eval.h), the
 * validation data, the GPT-2 vocabulary for prompts and samples, and a
 * host copy of the parameters. */
typedef struct evalstate {
    zs_gpt_eval_t *ev;
    zs_data_t *val;
    zs_bpe_t *bpe;
    float *params;
    int recorded;     /* bpe is the one the data records (not --vocab-dir) */
    zs_err_t bpe_err; /* the data records one that did not load: why */
} evalstate_t;

/* Before the ranks agree: open --val-data (vocab as the training data's)
 * and --vocab-dir, else for samples the vocabulary the data records
 * (zs_data_bpe: zs-tokenize --gpt2); a recorded one that does not load (its
 * folder gone or its files changed) leaves ids in the samples and
 * es->bpe_err set, not an error. 0 or ZS_EXIT_DATA with *what and *err
 * set. */
static int eval_open(const zs__train_opts_t *o, const zs_data_t *data, evalstate_t *es,
                     const char **what, zs_err_t *err)
{
    *what = o->val_data ? "--val-data" : "--vocab-dir";
    if (o->val_data && zs_data_open(o->val_data, &es->val, err))
        return ZS_EXIT_DATA;
    if (es->val && zs_data_vocab(es->val) != zs_data_vocab(data)) {
        zs_err_set(err, ZS_ERR_INVALID, "%s has vocab %u, the training data vocab %u", o->val_data,
                   zs_data_vocab(es->val), zs_data_vocab(data));
        return ZS_EXIT_DATA;
    }
    *what = "--vocab-dir";
    if (o->vocab_dir && zs_bpe_load(o->vocab_dir, &es->bpe, err))
        return ZS_EXIT_DATA;
    const zs_data_bpe_t *rec = zs_data_bpe(data);
    if (!o->vocab_dir && rec && o->sample_every)
        es->recorded = zs_data_bpe_load(rec, &es->bpe, &es->bpe_err) == ZS_OK;
    return 0;
}

static void eval_close(evalstate_t *es)
{
    zs_gpt_eval_destroy(es->ev);
    zs_data_close(es->val);
    zs_bpe_free(es->bpe);
    free(es->params);
}

/* After step `step` (collective): the validation loss into *val when due
 * (NAN otherwise), and rank 0's sample when due. */
static int eval_step(evalstate_t *es, const zs__train_opts_t *o, zs_engine_t *e, uint64_t step,
                     int rank, int W, double *val, zs_err_t *err)
{
    int last = step == (uint64_t)o->steps;
    int do_val = es->val && (step % (uint64_t)o->val_every == 0 || last);
    int do_sample = o->sample_every && (step % (uint64_t)o->sample_every == 0 || last);
    *val = NAN;
    if (!do_val && !do_sample)
        return ZS_OK;
    int rc = zs_engine_get_params(e, es->params, err);
    if (!rc)
        rc = zs_gpt_eval_set_params(es->ev, es->params, err);
    if (!rc && do_val) {
        double part[2] = {0, 0}, all[2];
        uint64_t pos = 0;
        rc = zs_gpt_eval_loss(es->ev, es->val, o->val_tokens, rank, W, &part[0], &pos, err);
        part[1] = (double)pos;
        int bad = rc != 0, anybad = 0;
        MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (anybad)
            return rc ? rc : zs_err_set(err, ZS_ERR_STATE, "validation failed on another rank");
        MPI_Allreduce(part, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        *val = all[0] / all[1];
    }
    if (!rc && do_sample && rank == 0) {
        int32_t *tok = malloc((size_t)o->g.ctx * sizeof *tok);
        int n = 0;
        zs_gpt_sample_opts_t so = {o->top_k, o->temperature, o->seed ^ (step * 0x9E3779B9ull)};
        rc = tok ? zs_gpt_eval_prompt(&o->g, es->bpe, o->prompt, tok, &n, o->g.ctx, err)
                 : zs_err_set(err, ZS_ERR_NOMEM, "out of memory");
        int n0 = n;
        if (!rc)
            rc = zs_gpt_eval_generate(es->ev, tok, &n, n + o->sample_tokens, &so, err);
        if (!rc) {
            printf("sample at step %llu (%d tokens after a %d-token prompt):\n---\n",
                   (unsigned long long)step, n - n0, n0);
            zs_gpt_eval_print(stdout, es->bpe, o->g.vocab, tok, n);
            printf("\n---\n");
            fflush(stdout);
        }
        free(tok);
    }
    return rc;
}

/* Make the ranks agree on the preflight outcome (collective on
 * MPI_COMM_WORLD; nothing else uses MPI yet): the lowest rank that failed
 * prints its error, once (rank 0 when all failed alike, the usual case),
 * and every rank gets its exit code, 0 if none failed. */
static int agree(int rank, int code, const char *what, const zs_err_t *err)
{
    int mine = code ? rank : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == INT_MAX)
        return 0;
    if (rank == first) {
        if (rank == 0)
            fprintf(stderr, "zs-train: %s error: %s\n", what, err->msg);
        else
            fprintf(stderr, "zs-train: rank %d: %s error: %s\n", rank, what, err->msg);
        fflush(stderr);
    }
    MPI_Bcast(&code, 1, MPI_INT, first, MPI_COMM_WORLD);
    return code;
}

/* A step or checkpoint failed on every worker: try to go on after a lost
 * server (zs_engine_recover). Returns ZS_OK when training can continue
 * (the CSV then lists steps up to the one recovered at), else the error. */
static int recover(zs_engine_t *e, const zs__train_opts_t *o, int rank, int *count, FILE **csv,
                   zs_err_t *err)
{
    if (!o->servers || *count >= o->max_recoveries)
        return err->code;
    if (strstr(err->msg, "another worker failed") == NULL) /* the worker that saw it */
        fprintf(stderr, "zs-train: rank %d: %s; recovering (%d of at most %d)\n", rank, err->msg,
                *count + 1, o->max_recoveries);
    (*count)++;
    uint64_t at = 0;
    zs_err_t rerr;
    if (zs_engine_recover(e, o->server_wait * 1000, &at, &rerr)) {
        *err = rerr;
        return rerr.code;
    }
    if (rank == 0) {
        printf("       recovered: rolled back to step %llu\n", (unsigned long long)at);
        if (*csv) {
            fclose(*csv);
            *csv = csv_open(o->csv, 1, at);
        }
    }
    return ZS_OK;
}

/* Rank 0 writes the final fp32 parameters (collective: stage 3 gathers). */
static int save_params(zs_engine_t *e, const char *path, int rank, zs_err_t *err)
{
    uint64_t P = zs_engine_num_params(e);
    float *w = malloc((P ? P : 1) * sizeof *w);
    if (!w)
        return zs_err_set(err, ZS_ERR_NOMEM, "out of memory for %llu parameters",
                          (unsigned long long)P);
    int rc = zs_engine_get_params(e, w, err);
    if (!rc && rank == 0) {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(w, sizeof *w, P, f) != P || fclose(f) != 0)
            rc = zs_err_set(err, ZS_ERR_IO, "cannot write %s", path);
    }
    free(w);
    return rc;
}

int main(int argc, char **argv)
{
    int provided;
    /* collectives run on the communicator's stream thread: SERIALIZED */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    int rank = 0, W = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    zs__train_opts_t o;
    int prc = zs__train_parse(argc, argv, &o, rank == 0);
    if (prc) {
        MPI_Finalize();
        return prc == 1 ? 0 : prc;
    }
    char tag[32];
    snprintf(tag, sizeof tag, "zs-train[%d]", rank);
    zs_log_set_tag(tag);

    zs_err_t err = {0};
    zs_config_t cfg;
    zs_config_defaults(&cfg);
    zs_data_t *data = NULL;
    char *token = NULL;
    const char *what = "";
    int code = preflight(&o, rank, W, &cfg, &token, &data, &what, &err);
    zs_init_from_t *init = NULL; /* --init-from's weights */
    if (!code && o.init_from)
        code = init_from_open(&o, data, &init, &what, &err);
    evalstate_t es = {0}; /* --val-data, --sample-every */
    if (!code)
        code = eval_open(&o, data, &es, &what, &err);
    zs_train_metrics_t *tm = NULL; /* rank 0's endpoint; a bad address is a usage error */
    if (!code && rank == 0 && o.metrics &&
        (zs_train_metrics_create(o.metrics, W, &tm, &err) ||
         (o.metrics_ready &&
          zs_metrics_write_address(zs_train_metrics_registry(tm), o.metrics_ready, &err)))) {
        what = "--metrics";
        code = ZS_EXIT_USAGE;
    }
    if ((code = agree(rank, code, what, &err)) != 0) {
        eval_close(&es);
        zs_init_from_free(init);
        zs_train_metrics_destroy(tm);
        if (data)
            zs_data_close(data);
        free(token);
        MPI_Finalize();
        return code;
    }
    o.g.vocab = (int)zs_data_vocab(data);
    zs__train_pick_t pick;
    if (zs__train_pick_device(o.device, rank, &pick, &err) != ZS_OK) {
        code = ZS_EXIT_DEVICE;
        if (rank == 0) {
            fprintf(stderr, "zs-train: device error: %s\n", err.msg);
            fflush(stderr);
        }
        zs_train_metrics_destroy(tm);
        zs_data_close(data);
        free(token);
        MPI_Finalize();
        return code;
    }

    zs_dev_t *dev = NULL;
    zs_coll_t *coll = NULL;
    if (pick.cuda) {
#ifdef ZS_TRAIN_CUDA
        if (zs_dev_cuda_create(pick.ordinal, &dev, &err))
            return die(rank, "CUDA device", &err, ZS_EXIT_DEVICE);
        if (zs_coll_nccl_create(dev, 0, &coll, &err))
            return die(rank, "NCCL", &err, ZS_EXIT_DEVICE);
#endif
    } else {
        if (zs_dev_cpu_create(1, &dev, &err))
            return die(rank, "device", &err, ZS_EXIT_OTHER);
        if (zs_coll_mpi_create(dev, &coll, &err))
            return die(rank, "MPI", &err, ZS_EXIT_OTHER);
    }
    zs_gpt_t *gpt;
    int gemm_dt = zs__train_gemm_dtype(o.gemm, cfg.dtype, pick.cuda),
        act_dt = zs__train_act_dtype(o.acts, cfg.dtype);
    cfg.act_ckpt |= o.act_ckpt; /* the flag is the section's shortcut */
    if (zs_gpt_create(&o.g, (int)cfg.micro_batch_per_gpu, o.seed, &gpt, &err) ||
        zs_gpt_set_compute(gpt, gemm_dt, &err) || zs_gpt_set_data(gpt, data, &err) ||
        zs_gpt_set_checkpointing(gpt, cfg.act_ckpt, cfg.act_ckpt_cpu, &err) ||
        zs_gpt_set_activations(gpt, act_dt, &err) ||
        zs_gpt_set_attention(
            gpt, strcmp(o.attention, "flash") ? ZS_GPT_ATTN_UNFUSED : ZS_GPT_ATTN_FLASH, &err) ||
        (o.split && zs_gpt_set_split(gpt, (uint64_t)cfg.reduce_bucket_size, &err)))
        return die(rank, "model", &err, ZS_EXIT_OTHER);
    char *manifest; /* stored with each checkpoint: zs-ctl export reads it */
    if (zs_gpt_manifest_bpe(&o.g, o.name, zs_data_bpe(data), &manifest, &err))
        return die(rank, "model", &err, ZS_EXIT_OTHER);
    zs_engine_opts_t eo = {&cfg, coll, o.servers, token, o.name, o.server_timeout * 1000, 0};
    eo.manifest = manifest;
    eo.transport = zs_transport_parse(o.transport);
    zs_gpt_decay_t decay = ZS_GPT_DECAY_ALL;
    zs_gpt_decay_parse(o.decay, &decay); /* checked with the options */
    zs_group_range_t *groups = NULL;
    if (zs_gpt_decay_groups(&o.g, decay, cfg.adam.weight_decay, &groups, &eo.ngroups, &err))
        return die(rank, "model", &err, ZS_EXIT_OTHER);
    eo.groups = groups;
    zs_engine_t *e;
    const zs_model_t *model = zs_gpt_model(gpt);
    if (init)
        model = zs_init_from_wrap(init, &o.g, model); /* init_params: the file's weights */
    int erc = zs_engine_create(&eo, model, &e, &err);
    free(manifest);
    free(groups);
    if (erc)
        return die(rank, "engine", &err, ZS_EXIT_ENGINE);
    uint64_t P = zs_engine_num_params(e);
    if (rank == 0) {
        printf("zs-train: %d workers, data %s (%llu tokens, vocab %u)\n", W, o.data,
               (unsigned long long)zs_data_count(data), zs_data_vocab(data));
        printf("model: GPT L=%d H=%d C=%d T=%d V=%d: %llu parameters (%.2fM)\n", o.g.layers,
               o.g.heads, o.g.width, o.g.ctx, o.g.vocab, (unsigned long long)P, P / 1e6);
        if (o.split)
            printf("split-layers: %d engine layers of at most %lld parameters where the GPT "
                   "splits\n",
                   zs_gpt_num_layers(gpt), (long long)cfg.reduce_bucket_size);
        if (init)
            printf("init-from: %s (%s): weights in, optimizer fresh at step 0\n", o.init_from,
                   zs_init_from_format(init));
        /* one line: the digest tells two runs' configurations apart, the
         * keys say what this one changed; the table only when asked */
        char *line = NULL;
        if (zs_config_summary(&cfg, &line, &err))
            return die(rank, "config", &err, ZS_EXIT_OTHER);
        printf("%s%s%s%s\n", line, o.csv ? " (table: " : " (--print-config prints the table)",
               o.csv ? o.csv : "", o.csv ? ".config.txt)" : "");
        free(line);
        if (o.print_config) {
            printf("configuration (resolved for W=%d):\n", W);
            zs_config_print(&cfg, stdout);
        }
        if (es.bpe && o.sample_every)
            printf("vocab: GPT-2 BPE of %s (%s)\n",
                   es.recorded ? zs_data_bpe(data)->dir : o.vocab_dir,
                   es.recorded ? "recorded in the token file" : "--vocab-dir");
        else if (es.bpe_err.code)
            fprintf(stderr,
                    "zs-train: warning: %s names the vocabulary %s: %s; samples print ids "
                    "(--vocab-dir DIR decodes)\n",
                    o.data, zs_data_bpe(data)->dir, es.bpe_err.msg);
        int attn = zs_gpt_attention(gpt);
        printf("device: %s%s%s; GEMMs %s%s; activations %s; attention %s%s\n", dev->desc,
               pick.cuda ? " (one GPU per rank, NCCL collectives)" : "", pick.note,
               zs_dtype_name(gemm_dt),
               gemm_dt == ZS_DTYPE_F32 ? "" : " operands, fp32 accumulation", zs_dtype_name(act_dt),
               attn == ZS_GPT_ATTN_FLASH ? "flash" : "unfused",
               attn != ZS_GPT_ATTN_FLASH && !strcmp(o.attention, "flash")
                   ? " (flash asked; this device or shape cannot: see --help)"
                   : "");
        char tline[512];
        zs_engine_transport_line(e, tline, sizeof tline);
        if (tline[0]) /* rank 0's view; every rank logs its own at info level */
            printf("transport: %s\n", tline);
        fflush(stdout);
    }
    uint64_t start = 0;
    int resumed = 0;
    if (o.resume || o.resume_auto) {
        int rc2 = zs_engine_resume(e, 0, &start, &err);
        if (rc2 == ZS_OK) {
            resumed = 1;
            if (rank == 0)
                printf("resumed from checkpoint %llu\n", (unsigned long long)start);
        } else if (rc2 == ZS_ERR_NOTFOUND && o.resume_auto) {
            if (rank == 0)
                printf("no checkpoint complete on every server: starting fresh\n");
            if (zs_engine_start(e, &err))
                return die(rank, "start", &err, ZS_EXIT_ENGINE);
        } else {
            return die(rank, "resume", &err, ZS_EXIT_ENGINE);
        }
    } else {
        /* A fresh start deletes the servers' checkpoints: not by accident. */
        uint64_t newest = 0;
        if (o.servers && !o.fresh && zs_engine_newest_checkpoint(e, &newest, &err))
            return die(rank, "listing checkpoints", &err, ZS_EXIT_ENGINE);
        if (newest) {
            if (rank == 0)
                fprintf(stderr,
                        "zs-train: the servers hold checkpoint %llu: --resume continues it, "
                        "--fresh starts over and deletes it\n",
                        (unsigned long long)newest);
            zs_engine_destroy(e);
            zs_init_from_free(init);
            zs_gpt_destroy(gpt);
            zs_coll_destroy(coll);
            zs_dev_destroy(dev);
            zs_data_close(data);
            free(token);
            MPI_Finalize();
            return ZS_EXIT_USAGE;
        }
        if (zs_engine_start(e, &err))
            return die(rank, "start", &err, ZS_EXIT_ENGINE);
    }
    zs_train_metrics_start(tm, P, start);
    if (es.val || o.sample_every) {
        if (!(es.params = malloc(P * sizeof *es.params)))
            return die(rank, "evaluator", &(zs_err_t){ZS_ERR_NOMEM, "out of memory"}, 1);
        if (zs_gpt_eval_create(&o.g, (int)cfg.micro_batch_per_gpu, &es.ev, &err))
            return die(rank, "evaluator", &err, ZS_EXIT_OTHER);
    }
    FILE *csv = NULL;
    if (rank == 0 && o.csv && !(csv = csv_open(o.csv, resumed, start)))
        MPI_Abort(MPI_COMM_WORLD, ZS_EXIT_OTHER);
    if (rank == 0 && o.csv) {
        char *path = malloc(strlen(o.csv) + sizeof ".config.txt");
        if (path)
            sprintf(path, "%s.config.txt", o.csv);
        if (!path || config_table(path, &cfg, W, resumed, start))
            MPI_Abort(MPI_COMM_WORLD, ZS_EXIT_OTHER);
        free(path);
    }
    double tokens_per_step = (double)cfg.train_batch_size * o.g.ctx, t_all = 0, first_loss = 0;
    double last_loss = 0;
    int nsteps = 0;
    if (rank == 0)
        printf("%6s %9s %10s %8s %9s %8s %8s %8s %8s\n", "step", "loss", "lr", "scale", "tok/s",
               "fwd ms", "bwd ms", "comm ms", "opt ms");
    int recoveries = 0;
    while (zs_engine_step_count(e) < (uint64_t)o.steps) {
        zs_step_stats_t st;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (zs_engine_step(e, &st, &err)) {
            if (recover(e, &o, rank, &recoveries, &csv, &err))
                return die(rank, "step", &err, ZS_EXIT_ENGINE);
            zs_train_metrics_recovered(tm, zs_engine_step_count(e));
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double sec = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        t_all += sec;
        if (nsteps++ == 0)
            first_loss = st.loss;
        last_loss = st.loss;
        double val;
        if (eval_step(&es, &o, e, st.step, rank, W, &val, &err))
            return die(rank, "validation / sample", &err, ZS_EXIT_OTHER);
        if (!isnan(val)) {
            zs_train_metrics_val(tm, st.step, val);
            if (rank == 0)
                printf("val loss %.4f at step %llu (%llu tokens)\n", val,
                       (unsigned long long)st.step,
                       (unsigned long long)(zs_data_count(es.val) < o.val_tokens
                                                ? zs_data_count(es.val)
                                                : o.val_tokens));
        }
        zs_train_metrics_step(tm, &st, sec, tokens_per_step, e);
        if (rank == 0 && (st.step % (uint64_t)o.log_every == 0 || st.step == (uint64_t)o.steps)) {
            printf("%6llu %9.4f %10.3g %8g %9.0f %8.1f %8.1f %8.1f %8.1f%s%s\n",
                   (unsigned long long)st.step, st.loss, st.lr, st.loss_scale,
                   tokens_per_step / sec, st.ms_forward, st.ms_backward, st.ms_comm,
                   st.ms_optimizer, st.skipped ? "  (skipped: overflow)" : "",
                   st.spec < 0 && !st.skipped ? "  (speculation rolled back)" : "");
            fflush(stdout);
        }
        if (csv) {
            /* val_loss stays the 13th column (deploy/plot.sh, test_init_from),
             * empty on steps without a validation */
            fprintf(csv, "%llu,%.6f,%.6g,%g,%.1f,%.2f,%.2f,%.2f,%.2f,%.2f,%d,%d,",
                    (unsigned long long)st.step, st.loss, st.lr, st.loss_scale,
                    tokens_per_step / sec, sec * 1e3, st.ms_forward, st.ms_backward, st.ms_comm,
                    st.ms_optimizer, st.skipped, W);
            if (!isnan(val))
                fprintf(csv, "%.6f", val);
            /* bytes_*: rank 0's collectives in the step, within and across
             * nodes (zs_coll.h's model); bwd_gather_bytes_inter: what the
             * backward's parameter gathers sent across nodes (0 with hpZ) */
            fprintf(csv, ",%d,%.2f,%.2f,%.2f,%llu,%llu,%llu\n", st.spec, st.ms_opt_push,
                    st.ms_opt_commit, st.ms_opt_pull,
                    (unsigned long long)zs_coll_bytes_intra(&st.bytes),
                    (unsigned long long)zs_coll_bytes_inter(&st.bytes),
                    (unsigned long long)(st.bytes_bwd.inter[ZS_COLL_K_ALL_GATHER] +
                                         st.bytes_bwd.inter[ZS_COLL_K_ALL_GATHER_Q8]));
            fflush(csv);
        }
        if (nsteps == 1 || (o.mem_every && st.step % (uint64_t)o.mem_every == 0)) {
            if (zs_engine_print_mem(e, stdout, &err))
                return die(rank, "memory table", &err, ZS_EXIT_ENGINE);
#ifdef ZS_TRAIN_CUDA
            if (pick.cuda)
                zs__train_print_gpu_mem(dev, rank, W);
#endif
            fflush(stdout);
        }
        if (o.ckpt_every && st.step % (uint64_t)o.ckpt_every == 0) {
            if (zs_engine_checkpoint(e, &err)) {
                if (recover(e, &o, rank, &recoveries, &csv, &err))
                    return die(rank, "checkpoint", &err, ZS_EXIT_ENGINE);
                zs_train_metrics_recovered(tm, zs_engine_step_count(e));
                continue;
            }
            zs_train_metrics_checkpoint(tm, st.step);
            if (rank == 0)
                printf("       checkpoint %llu complete on all servers\n",
                       (unsigned long long)st.step);
        }
    }
    if (rank == 0 && nsteps > 0)
        printf("done: steps %llu..%llu, loss %.4f -> %.4f, %.0f tokens/s on average, %.1f s\n",
               (unsigned long long)start + 1, (unsigned long long)zs_engine_step_count(e),
               first_loss, last_loss, tokens_per_step * nsteps / t_all, t_all);
    if (csv)
        fclose(csv);
    if (o.save_params && save_params(e, o.save_params, rank, &err))
        return die(rank, "--save-params", &err, ZS_EXIT_OTHER);
    zs_train_metrics_destroy(tm);
    zs_engine_destroy(e);
    zs_init_from_free(init);
    eval_close(&es);
    zs_gpt_destroy(gpt);
    zs_data_close(data);
    zs_coll_destroy(coll);
    zs_dev_destroy(dev);
    free(token);
    MPI_Finalize();
    return 0;
}
