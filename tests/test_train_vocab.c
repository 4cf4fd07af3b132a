/*
 * test_train_vocab.c - what zs-train says at start, and which vocabulary
 * zs-train and zs-generate decode with, end to end (2 zs-servers, MPI
 * workers, a small GPT-2-style vocabulary: zs_vocabtest.h).
 *
 *  1. Data: zs-tokenize --gpt2 DIR records DIR in the token file.
 *  2. A run on the embedded default config, W = 2, with --csv F and
 *     --sample-every, no --vocab-dir: the configuration is one line,
 *     "config <16 hex>: train_batch_size=16 ...", and no table; nothing in
 *     the log says "warn" (any case); F.config.txt holds the table under a
 *     "# zs-train started at step 0, 2 workers: config <same hex>" line;
 *     the log names the recorded vocabulary and the greedy sample is text
 *     (it starts with the <|endoftext|> prompt), not ids.
 *  3. --resume with W = 1 and --print-config up to checkpoint 4: the table
 *     is printed; the digest differs (accumulation 4); F.config.txt keeps
 *     the first start and appends the resumed one, whose table equals the
 *     printed one.
 *  4. zs-ctl export of checkpoint 4, then zs-generate without --vocab-dir:
 *     decodes with the vocabulary the export names (said on stderr): its
 *     greedy text equals zs-train's sample at that step; --ids prints ids.
 *  5. --vocab-dir wins over the record (the log says which); the recorded
 *     folder changed (its encoder.json rewritten): zs-train and zs-generate
 *     say so in one warning each, naming the file, and print ids.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_data.h"
#include "zs_proc.h"
#include "zs_test.h"
#include "zs_vocabtest.h"

#define TINY "--layers 1 --heads 2 --width 32 --ctx 16"

static char g_tmp[200], g_servers[256], g_data[300], g_vocab[300];

static const char *tpath(const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", g_tmp, name);
    return p[k];
}

/* mpirun -np W zs-train --data g_data TINY ARGS, all output to log. */
static void train(int W, const char *log, const char *args)
{
    zs_test_run_ok(log, "ZS_LOG_LEVEL=warn %s " ZS_TEST_MPI_OPTS " -np %d %s --data %s " TINY " %s",
                   ZS_MPIEXEC, W, ZS_TRAIN, g_data, args);
}

/* Lines of `file` that grep -E `re` matches (with grep's own flags). */
static int grep_count(const char *flags, const char *re, const char *file)
{
    char out[600];
    snprintf(out, sizeof out, "%s.count", file);
    zs_test_sh("grep -c %s -E -- '%s' %s > %s", flags, re, file, out);
    FILE *f = fopen(out, "r");
    int n = -1;
    TEST_CHECK(f && fscanf(f, "%d", &n) == 1);
    fclose(f);
    return n;
}

/* The first line of `file` matching `re` into buf ("" if none). */
static const char *grep_line(const char *re, const char *file, char *buf, size_t cap)
{
    char out[600];
    snprintf(out, sizeof out, "%s.line", file);
    zs_test_sh("grep -m1 -E -- '%s' %s > %s", re, file, out);
    FILE *f = fopen(out, "r");
    buf[0] = '\0';
    if (f && fgets(buf, (int)cap, f))
        buf[strcspn(buf, "\n")] = '\0';
    if (f)
        fclose(f);
    return buf;
}

static void show(const char *log)
{
    zs_test_sh("sed 's/^/   | /' %s >&2", log);
}

/* 2. the first run: one config line, the table file, the recorded vocab */
static void first_run(char *digest)
{
    const char *log = tpath("run1.log"), *csv = tpath("run1.csv");
    char args[1024], line[4096], want[700];
    snprintf(args, sizeof args,
             "--servers %s --steps 2 --ckpt-every 2 --csv %s --sample-every 2 --sample-tokens 6 "
             "--temperature 0",
             g_servers, csv);
    train(2, log, args);
    int cfg_lines = grep_count("", "^config [0-9a-f]{16}: train_batch_size=16 ", log);
    int table = grep_count("", "^[a-z_][a-z_.0-9]* = ", log), warn = grep_count("-i", "warn", log);
    if (cfg_lines != 1 || table != 0 || warn != 0)
        show(log);
    TEST_CHECKF(cfg_lines == 1, "%d 'config <digest>: ...' lines (want 1)", cfg_lines);
    TEST_CHECKF(table == 0, "%d 'key = value' lines: the table is printed without --print-config",
                table);
    TEST_CHECKF(warn == 0, "the default config's run says 'warn' %d times", warn);
    grep_line("^config ", log, line, sizeof line);
    snprintf(digest, 17, "%.16s", line + 7);
    snprintf(want, sizeof want, "(table: %s.config.txt)", csv);
    TEST_CHECKF(strstr(line, want) && strstr(line, " gradient_accumulation_steps=2 ") &&
                    strstr(line, " zero.stage=2 "),
                "config line '%s' lacks '%s' or the keys", line, want);
    printf("2. %s\n", line);
    /* the table file: a header line with the same digest, then the table */
    snprintf(want, sizeof want, "^# zs-train started at step 0, 2 workers: config %s$", digest);
    snprintf(args, sizeof args, "%s.config.txt", csv);
    TEST_CHECKF(grep_count("", want, args) == 1 &&
                    grep_count("", "^zero_optimization.stage = 2$", args) == 1 &&
                    grep_count("", "^train_batch_size = 16$", args) == 1,
                "%s lacks its header line or the table", args);
    /* the recorded vocabulary decodes the sample */
    snprintf(want, sizeof want, "^vocab: GPT-2 BPE of %s \\(recorded in the token file\\)$",
             g_vocab);
    int named = grep_count("", want, log);
    grep_line("^<\\|endoftext\\|>", log, line, sizeof line);
    if (named != 1 || !*line)
        show(log);
    TEST_CHECKF(named == 1, "the log does not name the recorded vocabulary (%s)", want);
    TEST_CHECKF(*line, "the sample is not text starting with <|endoftext|>");
    printf("2. %s.config.txt written; vocab named; sample decoded: %s\n", csv, line);
}

/* 3. resumed with W = 1 and --print-config */
static void resumed_run(const char *digest)
{
    const char *log = tpath("run2.log"), *csv = tpath("run1.csv");
    char args[1024], line[4096], table[600];
    snprintf(args, sizeof args,
             "--servers %s --resume --steps 4 --ckpt-every 2 --csv %s --print-config "
             "--sample-every 2 --sample-tokens 6 --temperature 0",
             g_servers, csv);
    train(1, log, args);
    /* the sample's text (between its two "---" lines), for zs-generate (4.) */
    zs_test_sh("awk '/^sample at step 4 /{s=1;next} s==1&&/^---$/{s=2;next} s==2&&/^---$/{exit} "
               "s==2{print}' %s > %s",
               log, tpath("sample.txt"));
    grep_line("^config ", log, line, sizeof line);
    int printed = grep_count("", "^configuration \\(resolved for W=1\\):$", log);
    if (printed != 1 || !strstr(line, " gradient_accumulation_steps=4 ") ||
        strncmp(line + 7, digest, 16) == 0)
        show(log);
    TEST_CHECKF(printed == 1, "--print-config printed no table");
    TEST_CHECKF(strncmp(line + 7, digest, 16) != 0 && strstr(line, "gradient_accumulation_steps=4"),
                "W=1's config line '%s' should differ from W=2's digest %s", line, digest);
    /* the file: both starts; the resumed table is the printed one */
    snprintf(table, sizeof table, "%s.config.txt", csv);
    TEST_CHECKF(grep_count("", "^# zs-train started at step 0, 2 workers: ", table) == 1 &&
                    grep_count("", "^# zs-train resumed at step 2, 1 workers: ", table) == 1,
                "%s does not hold both starts", table);
    TEST_CHECKF(zs_test_sh("sed -n '/^configuration (resolved/,/^activation_checkpointing = /p' "
                           "%s | tail -n +2 > %s && sed -n '/^# zs-train resumed/,$p' %s | "
                           "tail -n +2 > %s && cmp -s %s %s",
                           log, tpath("printed.txt"), table, tpath("filed.txt"),
                           tpath("printed.txt"), tpath("filed.txt")) == 0,
                "the printed table and the resumed section of %s differ", table);
    printf("3. --resume W=1 --print-config: table printed, digest changed, %s holds both starts\n",
           table);
}

/* 4. export, then zs-generate without --vocab-dir */
static void generate(void)
{
    const char *model = tpath("model.safetensors");
    TEST_CHECKF(zs_test_sh("ZS_LOG_LEVEL=warn %s export --servers %s --out %s > %s 2>&1", ZS_CTL,
                           g_servers, model, tpath("export.log")) == 0,
                "zs-ctl export failed (%s)", tpath("export.log"));
    int rc = zs_test_sh("%s --model %s --tokens 6 --temperature 0 > %s 2> %s", ZS_GENERATE, model,
                        tpath("gen.txt"), tpath("gen.err"));
    char want[600], line[4096];
    snprintf(want, sizeof want, "^zs-generate: vocab: GPT-2 BPE of %s \\(recorded in ", g_vocab);
    int named = grep_count("", want, tpath("gen.err"));
    grep_line("^<\\|endoftext\\|>", tpath("gen.txt"), line, sizeof line);
    if (rc || named != 1 || !*line) {
        show(tpath("gen.err"));
        show(tpath("gen.txt"));
    }
    TEST_CHECKF(rc == 0 && named == 1 && *line,
                "zs-generate without --vocab-dir: exit %d, vocab named %d times, text '%s'", rc,
                named, line);
    TEST_CHECKF(zs_test_sh("cmp -s %s %s", tpath("gen.txt"), tpath("sample.txt")) == 0,
                "zs-generate's greedy text (%s) differs from zs-train's step-4 sample (%s)",
                tpath("gen.txt"), tpath("sample.txt"));
    TEST_CHECK(zs_test_sh("%s --model %s --tokens 6 --temperature 0 --ids | grep -qE '^[0-9 ]+$'",
                          ZS_GENERATE, model) == 0);
    printf("4. zs-generate on the export, no --vocab-dir: %s (= zs-train's sample at step 4)\n",
           line);
}

/* 5. --vocab-dir wins; a changed folder is said, once, and ids printed */
static void overrides(void)
{
    char other[300], args[1024], want[600];
    snprintf(other, sizeof other, "%s/vocab-copy", g_tmp);
    zs_test_write_vocab(other);
    const char *log = tpath("run3.log");
    snprintf(args, sizeof args, "--steps 1 --sample-every 1 --sample-tokens 4 --vocab-dir %s",
             other);
    train(2, log, args);
    snprintf(want, sizeof want, "^vocab: GPT-2 BPE of %s \\(--vocab-dir\\)$", other);
    TEST_CHECKF(grep_count("", want, log) == 1, "the log does not name --vocab-dir's folder");
    /* the recorded folder's encoder.json rewritten: not the file the ids use */
    zs_test_sh("sed -i 's/\"ab\": 256/\"ba\": 256/' %s/encoder.json", g_vocab);
    snprintf(args, sizeof args, "--steps 1 --sample-every 1 --sample-tokens 4");
    train(2, log, args);
    int warned = grep_count("",
                            "^zs-train: warning: .*/encoder.json is not the file the tokens "
                            "were made with .*samples print ids",
                            log);
    int ids = grep_count("", "^[0-9]+( [0-9]+)+$", log);
    if (warned != 1 || ids != 1)
        show(log);
    TEST_CHECKF(warned == 1 && ids == 1, "changed vocabulary: %d warnings, %d id lines (want 1, 1)",
                warned, ids);
    int rc = zs_test_sh("%s --model %s --tokens 4 --temperature 0 > %s 2> %s", ZS_GENERATE,
                        tpath("model.safetensors"), tpath("gen2.txt"), tpath("gen2.err"));
    warned =
        grep_count("", "^zs-generate: warning: .*/encoder.json is not the file", tpath("gen2.err"));
    ids = grep_count("", "^[0-9]+( [0-9]+)+$", tpath("gen2.txt"));
    TEST_CHECKF(rc == 0 && warned == 1 && ids == 1,
                "zs-generate, changed vocabulary: exit %d, %d warnings, %d id lines", rc, warned,
                ids);
    printf("5. --vocab-dir wins; a changed folder: one warning each, ids printed\n");
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(g_tmp, sizeof g_tmp, "%s", zs_test_tmpdir("vocab"));
    snprintf(g_vocab, sizeof g_vocab, "%s/vocab", g_tmp);
    snprintf(g_data, sizeof g_data, "%s/corpus.tok", g_tmp);
    zs_test_write_vocab(g_vocab);
    /* 1. the token file records the folder */
    TEST_CHECKF(zs_test_sh("%s --gpt2 %s -q -o %s $(%s) > %s 2>&1", ZS_TOKENIZE, g_vocab, g_data,
                           ZS_TEST_LICENCES, tpath("tok.log")) == 0,
                "zs-tokenize --gpt2 failed (%s)", tpath("tok.log"));
    zs_err_t err;
    zs_data_t *d;
    TEST_OK(zs_data_open(g_data, &d, &err), err);
    const zs_data_bpe_t *rec = zs_data_bpe(d);
    TEST_CHECKF(rec && strcmp(rec->dir, g_vocab) == 0, "the token file records %s, not %s",
                rec ? rec->dir : "nothing", g_vocab);
    zs_data_close(d);
    printf("1. zs-tokenize --gpt2 recorded %s\n", g_vocab);
    zs_test_server_t srv[2];
    zs_test_servers_up(srv, 2, g_tmp, "s", "", g_servers, sizeof g_servers);
    char digest[17];
    first_run(digest);
    resumed_run(digest);
    generate();
    zs_test_servers_down(srv, 2);
    overrides();
    printf("PASS test_train_vocab\n");
    return 0;
}
