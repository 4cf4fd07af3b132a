/*
 * emu_test.h - helpers shared by the emulator's tests (header only, C and
 * C++): checks that print what they check, and running a case in a child
 * process (the test re-executes itself with "child <case>") to see it die
 * with the expected message. Not part of the emulator library.
 */
#ifndef ZS_EMU_TEST_H
#define ZS_EMU_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define EMU_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define EMU_CUDA(expr)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        EMU_CHECK(e_ == cudaSuccess, "%s returned %s", #expr, cudaGetErrorName(e_));               \
    } while (0)

typedef struct emu_child {
    int exited, code, signaled, sig;
    char out[16384]; /* stdout and stderr */
} emu_child;

static const char *emu_self;

/* Run "<self> child <name>" with extra environment "K=V" strings (NULL
 * terminated), capture its output. */
static void emu_run_child(emu_child *c, const char *name, const char *const *env)
{
    int p[2];
    memset(c, 0, sizeof *c);
    if (pipe(p))
        exit(2);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execl(emu_self, emu_self, "child", name, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(p[0], c->out + n, sizeof c->out - 1 - n)) > 0)
        n += (size_t)r;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    c->exited = WIFEXITED(st);
    c->code = c->exited ? WEXITSTATUS(st) : -1;
    c->signaled = WIFSIGNALED(st);
    c->sig = c->signaled ? WTERMSIG(st) : 0;
}

/* Died: killed by a signal, or (under a sanitizer that handles the
 * signal itself) exited non-zero. */
static int emu_died(const emu_child *c)
{
    return c->signaled || (c->exited && c->code != 0);
}

static int emu_has(const emu_child *c, const char *s)
{
    return strstr(c->out, s) != NULL;
}

#endif
