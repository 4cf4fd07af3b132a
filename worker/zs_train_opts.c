/*
 * zs_train_opts.c - zs-train's command line: the usage text, the defaults,
 * getopt_long parsing and the checks that need no file, and the precision
 * flags' dtypes. Every rank parses the same argv; only rank 0 prints.
 *
 * Not here: what the options do (zs_train_main.c), the config file and
 * the token file (read in zs_train_main.c's preflight).
 */
#include "zs_train_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_client.h"

void zs__train_usage(FILE *f)
{
    fprintf(f, "usage: mpirun -np N zs-train --data FILE.tok [options]\n"
               "\n"
               "  --data F         token file (zs-tokenize makes one from text), or llm.c\n"
               "                   .bin shards; a comma list or a glob ('dir/*_train_*.bin')\n"
               "                   is read as one stream, in order\n"
               "  --device D       auto (default): a GPU per rank when every rank has one,\n"
               "                   else the CPU; cuda: GPUs (NCCL), an error without;\n"
               "                   cpu: CPU workers (MPI collectives)\n"
               "  --gemm P         GEMM precision: auto (default: the config's bf16/fp16 on\n"
               "                   CUDA, fp32 on the CPU), fp32, bf16 or fp16 (operands\n"
               "                   rounded to P, fp32 accumulation; the CPU reproduces\n"
               "                   what the GPU computes)\n"
               "  --activations P  what the forward keeps for the backward (and the\n"
               "                   checkpoints): auto (default: the config's bf16/fp16, else\n"
               "                   fp32), fp32, bf16 or fp16; rounded where stored, compute\n"
               "                   in fp32 (LayerNorm statistics, softmax, loss stay fp32)\n"
               "  --attention A    unfused (default: the T x T probabilities kept for the\n"
               "                   backward) or flash (fused, FlashAttention-2 style: no\n"
               "                   T x T memory, probabilities recomputed in the backward;\n"
               "                   where the device cannot, unfused runs and says so)\n"
               "  --config F       DeepSpeed JSON config (default: embedded, ZeRO stage 2,\n"
               "                   train_batch_size 16, micro batch 4, AdamW lr 1e-3)\n"
               "  --activation-checkpointing  checkpoint every transformer block and\n"
               "                   recompute it in backward, as the config's\n"
               "                   \"activation_checkpointing\" section does (its\n"
               "                   cpu_checkpointing still applies)\n"
               "  --split-layers   engine layers no larger than reduce_bucket_size where\n"
               "                   the GPT can split (vocabulary rows of the embedding,\n"
               "                   four parts per block), so gradient buckets can be that\n"
               "                   small: the device-memory floor (docs/engine.md)\n"
               "  --print-config   print the resolved configuration, one key per line (by\n"
               "                   default one line: its XXH3-64 digest and the keys that\n"
               "                   differ from DeepSpeed's defaults; with --csv F the table\n"
               "                   is in F.config.txt either way)\n"
               "  --allow-unknown-keys  warn about unknown config keys and ignore them\n"
               "                   (default: an unknown key is an error naming the closest\n"
               "                   known one)\n"
               "  --servers LIST   shard servers host:port,... (optimizer offloaded when the\n"
               "                   config says offload_optimizer.device = cpu; checkpoints)\n"
               "  --transport T    how offloaded gradients and parameters reach the servers:\n"
               "                   auto (default: shared memory with each server that proves\n"
               "                   it runs on this host, gRPC with the others), shm (shared\n"
               "                   memory with every server, else exit 5 naming the one that\n"
               "                   refused), tcp (gRPC only)\n"
               "  --decay D        which parameters the optimizer's weight_decay applies to:\n"
               "                   all (default), 2d (embeddings and matmul weights, as\n"
               "                   nanoGPT and llm.c; no decay on biases and norms), matmul\n"
               "                   (the blocks' matmul weights only: no decay on biases,\n"
               "                   norms or embeddings); kept with checkpoints, a resume\n"
               "                   must use the same\n"
               "  --layers N       transformer blocks (default 4)\n"
               "  --heads N        attention heads (default 4)\n"
               "  --width N        model width C (default 128)\n"
               "  --ctx N          context length T (default 64)\n"
               "  --init-from F    start from pretrained GPT-2 weights: Hugging Face\n"
               "                   safetensors (zs-ctl export's layout) or an llm.c\n"
               "                   checkpoint (gpt2_124M.bin); the shape comes from F (a\n"
               "                   different --layers/--width is an error; --ctx may be\n"
               "                   smaller), the optimizer starts fresh at step 0\n"
               "  --val-data F     validation tokens (same formats as --data): the mean loss\n"
               "                   over the first --val-tokens of F (default 65536), in\n"
               "                   windows of T+1 shared by the ranks, every --val-every K\n"
               "                   steps (default 100) and after the last; printed, in the\n"
               "                   CSV (val_loss) and in the metrics\n"
               "  --sample-every K print a sample from rank 0 every K steps and after the last:\n"
               "                   --sample-tokens N (default 64, at most --ctx), --prompt\n"
               "                   TEXT, --top-k K (default 40), --temperature X (default\n"
               "                   1; 0 = greedy); seeded by --seed and the step\n"
               "  --vocab-dir DIR  GPT-2's encoder.json and vocab.bpe: encode --prompt and\n"
               "                   decode samples (default: the folder --data records when\n"
               "                   zs-tokenize --gpt2 made it; vocab 256 uses bytes; else ids)\n"
               "  --steps N        train until this step (default 200)\n"
               "  --ckpt-every K   checkpoint every K steps (needs --servers; default 0: off)\n"
               "  --resume         continue from the newest checkpoint complete on all servers\n"
               "                   (any worker count)\n"
               "  --fresh          start over even though the servers hold checkpoints (they\n"
               "                   are deleted: a run never mixes with an earlier one)\n"
               "  --resume-auto    resume when a checkpoint is complete on all servers, else\n"
               "                   start fresh (what zs-launch passes on a rerun)\n"
               "  --csv F          write per-step figures (appends on resume, without repeats)\n"
               "                   and the resolved configuration to F.config.txt (a resume\n"
               "                   appends its own)\n"
               "  --log-every K    progress line every K steps (default 1)\n"
               "  --mem-every K    memory table every K steps (default: after the first only)\n"
               "  --server-timeout S  deadline of one server call in seconds (default 60)\n"
               "  --server-wait S  how long to wait for a lost server to come back (default 300)\n"
               "  --max-recoveries N  lost-server recoveries before giving up (default 20)\n"
               "  --save-params F  write the final fp32 parameters (P floats, little-endian)\n"
               "  --name NAME      model name on the servers (default zs-gpt)\n"
               "  --seed S         initialisation seed (default 1337)\n"
               "  --token-file F   bearer token for the servers\n"
               "  --metrics HOST:PORT  rank 0 serves Prometheus metrics on\n"
               "                   http://HOST:PORT/metrics (port 0: a free one; docs/metrics.md)\n"
               "  --metrics-ready-file F  write the metrics endpoint's bound HOST:PORT to F\n"
               "\n"
               "exit codes: 0 done, 1 other failure, 2 command line (or --token-file\n"
               "unreadable, or --metrics not servable), 3 config, 4 data, 5 engine or\n"
               "shard servers, 6 no usable GPU for --device cuda (or its CUDA device /\n"
               "NCCL set-up failed). Command-line, config, data, token-file, --metrics and\n"
               "no-GPU errors are printed once (rank 0) and every rank exits with the\n"
               "code; later failures abort the job with theirs.\n");
}

/* The GEMM dtype of --gemm `name`: auto picks the config's dtype `cfg_dt` on
 * CUDA and fp32 on the CPU. -1 for an unknown name. */
int zs__train_gemm_dtype(const char *name, int cfg_dt, int cuda)
{
    if (!strcmp(name, "auto"))
        return cuda ? cfg_dt : ZS_DTYPE_F32;
    if (!strcmp(name, "fp32"))
        return ZS_DTYPE_F32;
    if (!strcmp(name, "bf16"))
        return ZS_DTYPE_BF16;
    if (!strcmp(name, "fp16"))
        return ZS_DTYPE_F16;
    return -1;
}

/* The activation dtype of --activations `name`: auto picks the config's
 * dtype `cfg_dt` (fp32, bf16 or fp16) on every device. -1 for an unknown
 * name. */
int zs__train_act_dtype(const char *name, int cfg_dt)
{
    return !strcmp(name, "auto") ? cfg_dt : zs__train_gemm_dtype(name, cfg_dt, 0);
}

/* Parse the command line into *o. Returns 0, 1 for --help (printed), or
 * ZS_EXIT_USAGE (reason printed). Only `loud` (rank 0) prints: every rank
 * sees the same argv. */
int zs__train_parse(int argc, char **argv, zs__train_opts_t *o, int loud)
{
    FILE *out = loud ? stdout : NULL, *errf = loud ? stderr : NULL;
    memset(o, 0, sizeof *o);
    o->g = (zs_gpt_config_t){4, 4, 128, 64, 256};
    o->steps = 200;
    o->log_every = 1;
    o->seed = 1337;
    o->name = "zs-gpt";
    o->server_timeout = 60;
    o->server_wait = 300;
    o->max_recoveries = 20;
    o->device = "auto";
    o->gemm = "auto";
    o->acts = "auto";
    o->transport = "auto";
    o->decay = "all";
    o->attention = "unfused";
    o->val_every = 100;
    o->val_tokens = 65536;
    o->sample_tokens = 64;
    o->top_k = 40;
    o->temperature = 1.0;
    /* clang-format off */
    static const struct option lo[] = {
        {"data", 1, 0, 'd'},        {"config", 1, 0, 'c'},
        {"servers", 1, 0, 's'},     {"layers", 1, 0, 'L'},
        {"heads", 1, 0, 'H'},       {"width", 1, 0, 'C'},
        {"ctx", 1, 0, 'T'},         {"steps", 1, 0, 'n'},
        {"ckpt-every", 1, 0, 'k'},  {"resume", 0, 0, 'r'},
        {"csv", 1, 0, 'v'},         {"log-every", 1, 0, 'l'},
        {"name", 1, 0, 'N'},        {"seed", 1, 0, 'S'},
        {"token-file", 1, 0, 't'},  {"mem-every", 1, 0, 'm'},
        {"resume-auto", 0, 0, 'R'}, {"server-timeout", 1, 0, 'o'},
        {"server-wait", 1, 0, 'w'}, {"max-recoveries", 1, 0, 'x'},
        {"save-params", 1, 0, 'p'}, {"allow-unknown-keys", 0, 0, 'u'},
        {"fresh", 0, 0, 'F'},       {"device", 1, 0, 'D'},
        {"metrics", 1, 0, 'P'},     {"metrics-ready-file", 1, 0, 'Q'},
        {"gemm", 1, 0, 'G'},        {"help", 0, 0, 'h'},
        {"init-from", 1, 0, 'I'},   {"val-data", 1, 0, 1000},
        {"val-every", 1, 0, 1001},  {"val-tokens", 1, 0, 1002},
        {"sample-every", 1, 0, 1003}, {"sample-tokens", 1, 0, 1004},
        {"prompt", 1, 0, 1005},     {"vocab-dir", 1, 0, 1006},
        {"top-k", 1, 0, 1007},      {"temperature", 1, 0, 1008},
        {"activation-checkpointing", 0, 0, 1009}, {"activations", 1, 0, 1010},
        {"split-layers", 0, 0, 1011}, {"print-config", 0, 0, 1012},
        {"transport", 1, 0, 1013},  {"decay", 1, 0, 1014},
        {"attention", 1, 0, 1015},
        {0, 0, 0, 0}};
    /* clang-format on */
    int ch;
    opterr = 0; /* one line of our own instead, from rank 0 only */
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'd':
            o->data = optarg;
            break;
        case 'c':
            o->config = optarg;
            break;
        case 's':
            o->servers = optarg;
            break;
        case 'L':
            o->g.layers = atoi(optarg);
            o->given_l = 1;
            break;
        case 'H':
            o->g.heads = atoi(optarg);
            o->given_h = 1;
            break;
        case 'C':
            o->g.width = atoi(optarg);
            o->given_c = 1;
            break;
        case 'T':
            o->g.ctx = atoi(optarg);
            o->given_t = 1;
            break;
        case 'I':
            o->init_from = optarg;
            break;
        case 1000:
            o->val_data = optarg;
            break;
        case 1001:
            o->val_every = atoi(optarg);
            break;
        case 1002:
            o->val_tokens = strtoull(optarg, NULL, 10);
            break;
        case 1003:
            o->sample_every = atoi(optarg);
            break;
        case 1004:
            o->sample_tokens = atoi(optarg);
            break;
        case 1005:
            o->prompt = optarg;
            break;
        case 1006:
            o->vocab_dir = optarg;
            break;
        case 1007:
            o->top_k = atoi(optarg);
            break;
        case 1008:
            o->temperature = atof(optarg);
            break;
        case 1009:
            o->act_ckpt = 1;
            break;
        case 1010:
            o->acts = optarg;
            break;
        case 1015:
            o->attention = optarg;
            break;
        case 1011:
            o->split = 1;
            break;
        case 1012:
            o->print_config = 1;
            break;
        case 1013:
            o->transport = optarg;
            break;
        case 1014:
            o->decay = optarg;
            break;
        case 'n':
            o->steps = atoi(optarg);
            break;
        case 'k':
            o->ckpt_every = atoi(optarg);
            break;
        case 'r':
            o->resume = 1;
            break;
        case 'v':
            o->csv = optarg;
            break;
        case 'l':
            o->log_every = atoi(optarg);
            break;
        case 'N':
            o->name = optarg;
            break;
        case 'S':
            o->seed = strtoull(optarg, NULL, 10);
            break;
        case 't':
            o->token_file = optarg;
            break;
        case 'm':
            o->mem_every = atoi(optarg);
            break;
        case 'R':
            o->resume_auto = 1;
            break;
        case 'F':
            o->fresh = 1;
            break;
        case 'o':
            o->server_timeout = atoi(optarg);
            break;
        case 'w':
            o->server_wait = atoi(optarg);
            break;
        case 'x':
            o->max_recoveries = atoi(optarg);
            break;
        case 'p':
            o->save_params = optarg;
            break;
        case 'u':
            o->allow_unknown = 1;
            break;
        case 'D':
            o->device = optarg;
            break;
        case 'P':
            o->metrics = optarg;
            break;
        case 'Q':
            o->metrics_ready = optarg;
            break;
        case 'G':
            o->gemm = optarg;
            break;
        case 'h':
            if (out)
                zs__train_usage(out);
            return 1;
        default:
            if (errf)
                fprintf(errf, "zs-train: bad option %s (--help for usage)\n", argv[optind - 1]);
            return ZS_EXIT_USAGE;
        }
    }
    const char *bad = NULL;
    if (optind < argc)
        bad = "unexpected argument";
    else if (!o->data)
        bad = "--data is required";
    else if (strcmp(o->device, "auto") && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        bad = "--device must be auto, cpu or cuda";
    else if (zs__train_gemm_dtype(o->gemm, ZS_DTYPE_F32, 0) < 0)
        bad = "--gemm must be auto, fp32, bf16 or fp16";
    else if (zs__train_act_dtype(o->acts, ZS_DTYPE_F32) < 0)
        bad = "--activations must be auto, fp32, bf16 or fp16";
    else if (strcmp(o->attention, "unfused") && strcmp(o->attention, "flash"))
        bad = "--attention must be unfused or flash";
    else if (zs_transport_parse(o->transport) < 0)
        bad = "--transport must be auto, shm or tcp";
    else if (zs_gpt_decay_parse(o->decay, &(zs_gpt_decay_t){0}) != ZS_OK)
        bad = "--decay must be all, 2d or matmul";
    else if ((o->ckpt_every || o->resume || o->resume_auto) && !o->servers)
        bad = "--ckpt-every and --resume need --servers";
    else if (o->init_from && (o->resume || o->resume_auto))
        bad = "--init-from starts a fresh run; --resume and --resume-auto continue a checkpoint";
    else if (o->val_every < 1 || o->val_tokens < 2 || o->sample_every < 0 || o->sample_tokens < 1 ||
             o->top_k < 0 || !(o->temperature >= 0))
        bad = "bad --val-every, --val-tokens, --sample-every, --sample-tokens, --top-k or "
              "--temperature";
    else if (o->metrics_ready && !o->metrics)
        bad = "--metrics-ready-file needs --metrics";
    else if (o->g.layers < 1 || o->g.heads < 1 || o->g.width % o->g.heads || o->g.ctx < 2 ||
             o->steps < 1 || o->log_every < 1 || o->mem_every < 0 || o->server_timeout < 1 ||
             o->server_wait < 0 || o->max_recoveries < 0)
        bad = "bad model shape or step counts (width % heads must be 0)";
    if (bad && errf)
        fprintf(errf, "zs-train: %s%s%s (--help for usage)\n", bad, optind < argc ? ": " : "",
                optind < argc ? argv[optind] : "");
    return bad ? ZS_EXIT_USAGE : 0;
}
