/*
 * emu_fiber.cpp - fibers and the per-block scheduler of the CUDA emulator
 * (tests/cuda_emu/): the x86-64 context switch, pooled fiber stacks with
 * guard pages (annotated for ASan), rounds in schedule order, barriers,
 * warp shuffles and votes, shared-memory poisoning notes, and the
 * diagnostics for undefined behaviour of barriers and warp operations.
 *
 * A block's threads are fibers on the executor thread that runs the launch
 * (so thread_local storage is block-shared). A fiber runs until it blocks
 * at a barrier or warp operation, or returns; when all have stopped, the
 * scheduler resolves the barriers and warp operations that are complete
 * and starts the next round. Under ZS_EMU_SCHEDULE=eager[:SEED]
 * (eager_round) each warp runs on its own in turn, its warp operations
 * completing as soon as its lanes arrive; barriers are resolved as above.
 *
 * Does not: launch, validate or order blocks (emu_launch.cpp), model warps
 * executing in lock step (threads of a warp interleave only at warp
 * operations and barriers, one legal schedule under independent thread
 * scheduling), cooperative groups.
 */
#include "emu_fiber.h"

__thread zs_emu_tview *zs_emu_tv;
__thread uint3 zs_emu_bid, zs_emu_bdim, zs_emu_gdim;

/* ---- The context switch: callee-saved registers, MXCSR and the x87
 * control word (System V AMD64 ABI: those are preserved across calls). */
/* ---- The context switch: callee-saved registers, MXCSR and the x87
 * control word (System V AMD64 ABI: those are preserved across calls). */
extern "C" void zs_emu_ctx_switch(void **save_sp, void *new_sp);
extern "C" void zs_emu_fiber_tramp(void);
asm(R"(
.text
.globl zs_emu_ctx_switch
.type zs_emu_ctx_switch,@function
zs_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size zs_emu_ctx_switch, .-zs_emu_ctx_switch
.globl zs_emu_fiber_tramp
.type zs_emu_fiber_tramp,@function
zs_emu_fiber_tramp:
    movq %r12, %rdi
    callq *%rbx
    ud2
.size zs_emu_fiber_tramp, .-zs_emu_fiber_tramp
.section .note.GNU-stack,"",@progbits
.text
)");

namespace zs_emu
{

thread_local sched *t_s;
int g_schedule;
uint64_t g_seed = 1;
int g_eager_seeded;
uint64_t g_launches;
size_t g_stack;

namespace
{
__thread fiber *t_cur;
} // namespace

uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void order(std::vector<unsigned> &o, unsigned n, uint64_t *rng)
{
    o.resize(n);
    for (unsigned i = 0; i < n; i++)
        o[i] = g_schedule == 1 ? n - 1 - i : i;
    if (g_schedule == 2)
        for (unsigned i = n; i > 1; i--) {
            unsigned j = (unsigned)(rng_next(rng) % i);
            std::swap(o[i - 1], o[j]);
        }
}

[[noreturn]] static void kfatal(const launch *L, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void kfatal(const launch *L, const char *file, int line, const char *fmt, ...)
{
    char where[512], msg[768];
    snprintf(where, sizeof where, "kernel %s (launched at %s:%d), %s:%d", L->name, L->file, L->line,
             file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zs_emu_fatal(where, "%s", msg);
}

void switch_to_sched(fiber *f)
{
#if ZS_ASAN
    /* Never "exiting": the fiber is pooled and resumed for later threads. */
    __sanitizer_start_switch_fiber(&f->asan_fake, t_s->main_bottom, t_s->main_size);
    zs_emu_ctx_switch(&f->sp, t_s->sp);
    __sanitizer_finish_switch_fiber(f->asan_fake, &t_s->main_bottom, &t_s->main_size);
#else
    zs_emu_ctx_switch(&f->sp, t_s->sp);
#endif
}

void fiber_main(fiber *f)
{
#if ZS_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &t_s->main_bottom, &t_s->main_size);
#endif
    for (;;) {
        t_s->L->run(t_s->L->closure);
        f->state = F_DONE;
        switch_to_sched(f);
    }
}

fiber *fiber_new()
{
    fiber *f = new fiber();
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    f->map_len = g_stack + pg;
    f->map = (char *)mmap(nullptr, f->map_len, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (f->map == MAP_FAILED)
        zs_emu_fatal("kernel launch", "cannot map a fiber stack");
    mprotect(f->map, pg, PROT_NONE); /* guard page: a stack overflow faults */
    uintptr_t top = ((uintptr_t)(f->map + f->map_len)) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = (void *)zs_emu_fiber_tramp; /* at top - 8: ret lands 16-aligned */
    *--sp = nullptr;                    /* rbp */
    *--sp = (void *)fiber_main;         /* rbx: the function */
    *--sp = (void *)f;                  /* r12: its argument */
    *--sp = nullptr;                    /* r13 */
    *--sp = nullptr;                    /* r14 */
    *--sp = nullptr;                    /* r15 */
    uint32_t ctl[2] = {0x1F80, 0x037F}; /* default MXCSR, x87 control word */
    --sp;
    memcpy(sp, ctl, 8);
    f->sp = sp;
    return f;
}

void resume(fiber *f)
{
    t_cur = f;
    zs_emu_tv = &f->tv;
#if ZS_ASAN
    __sanitizer_start_switch_fiber(&t_s->main_fake, f->map, f->map_len);
    zs_emu_ctx_switch(&t_s->sp, f->sp);
    __sanitizer_finish_switch_fiber(t_s->main_fake, nullptr, nullptr);
#else
    zs_emu_ctx_switch(&t_s->sp, f->sp);
#endif
    t_cur = nullptr;
}

const char *state_where(const fiber *f, char *buf, size_t n)
{
    if (f->state == F_DONE)
        snprintf(buf, n, "has exited");
    else if (f->state == F_BAR)
        snprintf(buf, n, "waits at %s at %s:%d", bar_name[f->op], f->file, f->line);
    else if (f->state == F_WARP)
        snprintf(buf, n, "waits at %s(mask 0x%08x) at %s:%d", warp_op_name[f->op], f->mask, f->file,
                 f->line);
    else
        snprintf(buf, n, "is running");
    return buf;
}

/* Complete the warp operation of the lanes in mask (all arrived, checked). */
void complete_warp(fiber **w, unsigned nl, unsigned mask)
{
    unsigned ballot = 0;
    for (unsigned l = 0; l < nl; l++)
        if ((mask >> l & 1) && w[l]->val)
            ballot |= 1u << l;
    for (unsigned l = 0; l < nl; l++) {
        if (!(mask >> l & 1))
            continue;
        fiber *f = w[l];
        int width = f->width;
        unsigned seg = l & ~(unsigned)(width - 1);
        long src = l;
        switch (f->op) {
        case W_IDX:
            /* "If srcLane is outside the range [0:width-1], the value
             * returned corresponds to the value of var held by the srcLane
             * modulo width". */
            src = seg + ((unsigned)f->arg & (unsigned)(width - 1));
            break;
        case W_UP:
            /* "var will be unchanged" for lanes below delta in their
             * segment. */
            src = (long)(l - seg) >= f->arg ? (long)l - f->arg : (long)l;
            break;
        case W_DOWN:
            src = (long)(l - seg) + f->arg < width ? (long)l + f->arg : (long)l;
            break;
        case W_XOR:
            /* Accessing a later group of width lanes returns own value. */
            src = (long)(l ^ ((unsigned)f->arg & 31u));
            if (src >= (long)(seg + width))
                src = l;
            break;
        default:
            break;
        }
        if (f->op == W_BALLOT)
            f->result = ballot;
        else if (f->op == W_SYNC)
            f->result = 0;
        else if (src < (long)nl && (mask >> src & 1))
            f->result = w[src]->val;
        else
            /* Reading a lane that does not take part: "If the target thread
             * is inactive, the retrieved value is undefined" (Programming
             * Guide, Warp Shuffle Functions). Hostile: poison bits. */
            f->result = ~0ull;
        f->state = F_RUN;
    }
}

/* Complete the warp operations of one warp (its nl lanes at w, in a block
 * of n threads) that every lane named in their mask has reached; returns
 * whether any lane became runnable. */
int resolve_warp(fiber **w, unsigned nl, unsigned n)
{
    const launch *L = t_s->L;
    int woke = 0;
    char b1[256];
    /* Warp operations (Programming Guide, Warp Shuffle Functions and Warp
     * Vote Functions: every thread named in mask must execute the same
     * intrinsic with the same mask; __syncwarp: "Each calling thread must
     * have its own bit set in the mask and all non-exited threads named in
     * mask must execute a corresponding __syncwarp() with the same mask").
     * Hostile reading, as the project asks: a mask naming a lane that has
     * exited or waits elsewhere is an error for __syncwarp too. */
    for (unsigned l = 0; l < nl; l++) {
        fiber *f = w[l];
        if (f->state != F_WARP)
            continue;
        int ready = 1;
        for (unsigned j = 0; j < 32 && ready; j++) {
            if (!(f->mask >> j & 1))
                continue;
            if (j >= nl)
                kfatal(L, f->file, f->line,
                       "%s in thread %u (lane %u): mask 0x%08x names lane %u, which does "
                       "not exist (block of %u threads)",
                       warp_op_name[f->op], f->idx, l, f->mask, j, n);
            fiber *g = w[j];
            if (g->state == F_RUN) {
                ready = 0;
            } else if (g->state != F_WARP || g->mask != f->mask || g->op != f->op) {
                kfatal(L, f->file, f->line,
                       "%s(mask 0x%08x) in thread %u (lane %u): lane %u (thread %u) %s",
                       warp_op_name[f->op], f->mask, f->idx, l, j, g->idx,
                       state_where(g, b1, sizeof b1));
            }
        }
        if (ready) {
            complete_warp(w, nl, f->mask);
            woke = 1;
        }
    }
    return woke;
}

/* Resolve what can be resolved after a round; returns whether any fiber
 * became runnable. */
int resolve(std::vector<fiber *> &fs, unsigned n)
{
    const launch *L = t_s->L;
    int woke = 0;
    char b1[256], b2[256];
    for (unsigned w0 = 0; w0 < n; w0 += 32) {
        unsigned nl = n - w0 < 32 ? n - w0 : 32;
        woke |= resolve_warp(&fs[w0], nl, n);
    }
    if (woke)
        return 1;
    /* Barriers (Programming Guide, Synchronization Functions: __syncthreads
     * "is allowed in conditional code but only if the conditional evaluates
     * identically across the entire thread block"). Hostile readings: an
     * exited thread does not count as arrived, and threads waiting at
     * __syncthreads on different source lines diverge. */
    fiber *first = nullptr;
    for (unsigned i = 0; i < n; i++)
        if (fs[i]->state == F_BAR) {
            first = fs[i];
            break;
        }
    if (!first)
        return 0;
    int count = 0;
    for (unsigned i = 0; i < n; i++) {
        fiber *g = fs[i];
        if (g->state == F_RUN)
            return 0;
        if (g->state == F_BAR && g->file == first->file && g->line == first->line &&
            g->op == first->op) {
            count += g->val != 0;
            continue;
        }
        if (g->state == F_WARP)
            continue; /* reported below if nothing else can move */
        kfatal(L, first->file, first->line,
               "barrier divergence: thread %u (%u,%u,%u) %s, while thread %u (%u,%u,%u) %s",
               first->idx, first->tv.tid.x, first->tv.tid.y, first->tv.tid.z,
               state_where(first, b1, sizeof b1), g->idx, g->tv.tid.x, g->tv.tid.y, g->tv.tid.z,
               state_where(g, b2, sizeof b2));
    }
    for (unsigned i = 0; i < n; i++)
        if (fs[i]->state == F_WARP)
            kfatal(L, first->file, first->line,
                   "barrier divergence: thread %u %s, while thread %u %s", first->idx,
                   state_where(first, b1, sizeof b1), fs[i]->idx,
                   state_where(fs[i], b2, sizeof b2));
    int all = count == (int)n;
    for (unsigned i = 0; i < n; i++) {
        fiber *g = fs[i];
        g->result = g->op == ZS_BAR_COUNT ? (uint64_t)count
                    : g->op == ZS_BAR_AND ? (uint64_t)all
                    : g->op == ZS_BAR_OR  ? (uint64_t)(count > 0)
                                          : 0;
        g->state = F_RUN;
    }
    return 1;
}

/* One round of ZS_EMU_SCHEDULE=eager[:SEED]: the block's warps one after
 * another (lowest first; seeded: a random order per round), each run
 * ahead on its own: its lanes resume in lane order, and a warp operation
 * completes as soon as every lane named in its mask has reached it, not
 * once the whole block has stopped; the warp goes on until none of its
 * lanes can move (all wait at __syncthreads, have exited, or wait at a
 * warp operation that cannot complete) before the next warp runs at all.
 * Legal under the CUDA C++ Programming Guide: SIMT Architecture
 * (Independent Thread Scheduling: warps, and the threads of a warp, make
 * progress independently) and Warp Matrix Functions / Warp Shuffle
 * Functions (a warp operation waits for the lanes of its warp, nothing is
 * said about other warps); only a barrier (Synchronization Functions,
 * __syncthreads: "waits until all threads in the thread block have reached
 * this point and all global and shared memory accesses made by these
 * threads prior to __syncthreads() are visible to all threads in the
 * block") orders one warp's accesses with another's. Barriers are still
 * resolved by resolve() once every warp has stopped, so a warp's reads
 * after a warp operation come before the stores of later warps that the
 * kernel did not order with a barrier: such a race reads poison. Warp
 * operations never wait on another warp, so no warp run later can make an
 * earlier one runnable within the round. */
void eager_round(sched *s, unsigned n, uint64_t *rng, std::vector<unsigned> &ord)
{
    unsigned nw = (n + 31) / 32;
    ord.resize(nw);
    for (unsigned i = 0; i < nw; i++)
        ord[i] = i;
    if (g_eager_seeded)
        for (unsigned i = nw; i > 1; i--) {
            unsigned j = (unsigned)(rng_next(rng) % i);
            std::swap(ord[i - 1], ord[j]);
        }
    for (unsigned k = 0; k < nw; k++) {
        unsigned w0 = ord[k] * 32, nl = n - w0 < 32 ? n - w0 : 32;
        fiber **w = &s->pool[w0];
        do {
            for (unsigned l = 0; l < nl; l++)
                if (w[l]->state == F_RUN)
                    resume(w[l]);
        } while (resolve_warp(w, nl, n));
    }
}

void run_block(const launch *L, uint3 bid, uint64_t *rng, std::vector<unsigned> &ord)
{
    sched *s = t_s;
    unsigned n = L->block.x * L->block.y * L->block.z;
    while (s->pool.size() < n)
        s->pool.push_back(fiber_new());
    zs_emu_bid = bid;
    s->epoch++;
    /* Shared memory is not initialised: poison it before each block. */
    if (L->shmem)
        memset(s->dyn, ZS_EMU_POISON, L->shmem);
    for (unsigned i = 0; i < n; i++) {
        fiber *f = s->pool[i];
        f->idx = i;
        f->tv.tid.x = i % L->block.x;
        f->tv.tid.y = i / L->block.x % L->block.y;
        f->tv.tid.z = i / (L->block.x * L->block.y);
        f->tv.lane = i % 32;
        f->state = F_RUN;
    }
    for (;;) {
        if (g_schedule == 3) {
            eager_round(s, n, rng, ord);
        } else {
            order(ord, n, rng);
            for (unsigned k = 0; k < n; k++) {
                fiber *f = s->pool[ord[k]];
                if (f->state == F_RUN)
                    resume(f);
            }
        }
        unsigned done = 0;
        for (unsigned i = 0; i < n; i++)
            done += s->pool[i]->state == F_DONE;
        if (done == n)
            return;
        if (!resolve(s->pool, n)) {
            char b[256];
            fiber *f = nullptr;
            for (unsigned i = 0; i < n && !f; i++)
                if (s->pool[i]->state != F_DONE)
                    f = s->pool[i];
            kfatal(L, f->file, f->line, "deadlock: thread %u %s and no thread can proceed", f->idx,
                   state_where(f, b, sizeof b));
        }
    }
}

fiber *self(const char *what, const char *file, int line)
{
    fiber *f = t_cur;
    if (!f) {
        char where[300];
        snprintf(where, sizeof where, "%s:%d", file, line);
        zs_emu_fatal(where, "%s called outside a kernel", what);
    }
    return f;
}

} // namespace zs_emu

using namespace zs_emu;

extern "C" {

int zs_emu_kernel_fault(const void *addr, char *msg, size_t n)
{
    /* Called from the SIGSEGV handler of the protected build, on the
     * faulting thread: no locks, only this thread's state. */
    sched *s = t_s;
    const char *a = (const char *)addr;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (!s)
        return 0;
    const launch *L = s->L;
    if (s->dyn_map && a >= (const char *)s->dyn_map + s->dyn_map_len - pg &&
        a < (const char *)s->dyn_map + s->dyn_map_len)
        return snprintf(msg, n,
                        "cuda-emu: kernel %s: access past the end of dynamic shared memory at "
                        "%p (%zu bytes requested by the launch at %s:%d)\n",
                        L ? L->name : "?", addr, L ? L->shmem : 0, L ? L->file : "?",
                        L ? L->line : 0);
    for (fiber *f : s->pool)
        if (a >= f->map - pg && a < f->map + pg)
            return snprintf(msg, n,
                            "cuda-emu: kernel %s: stack overflow in a kernel thread at %p (fiber "
                            "stacks are %zu KiB: raise ZS_EMU_STACK_KB)\n",
                            L ? L->name : "?", addr, g_stack >> 10);
    return 0;
}

void zs_emu_kernel_thread_exit(void)
{
    sched *s = t_s;
    if (!s)
        return;
    for (fiber *f : s->pool) {
        munmap(f->map, f->map_len);
        delete f;
    }
#if ZS_ASAN
    free(s->dyn);
#else
    if (s->dyn_map)
        munmap(s->dyn_map, s->dyn_map_len);
#endif
    delete s;
    t_s = nullptr;
}

void zs_emu_syncthreads(const char *file, int line)
{
    zs_emu_syncthreads_op(ZS_BAR_PLAIN, 1, file, line);
}

int zs_emu_syncthreads_op(int op, int pred, const char *file, int line)
{
    fiber *f = self(bar_name[op], file, line);
    f->state = F_BAR;
    f->op = op;
    f->val = (uint64_t)pred;
    f->file = file;
    f->line = line;
    switch_to_sched(f);
    return (int)f->result;
}

uint64_t zs_emu_warp_op(int op, unsigned mask, uint64_t bits, int arg, int width, const char *file,
                        int line)
{
    fiber *f = self(warp_op_name[op], file, line);
    if (!(mask >> f->tv.lane & 1))
        kfatal(t_s->L, file, line,
               "%s(mask 0x%08x) in thread %u: the calling lane %u is not in "
               "the mask",
               warp_op_name[op], mask, f->idx, f->tv.lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        /* "width must have a value which is a power of 2 ... results are
         * undefined if width is not a power of 2, or is a number greater
         * than warpSize." */
        kfatal(t_s->L, file, line, "%s: width %d is not a power of 2 in [1, 32]", warp_op_name[op],
               width);
    f->state = F_WARP;
    f->op = op;
    f->mask = mask;
    f->val = bits;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;
    switch_to_sched(f);
    return f->result;
}

void zs_emu_syncwarp(unsigned mask, const char *file, int line)
{
    zs_emu_warp_op(W_SYNC, mask, 0, 0, 32, file, line);
}

int zs_emu_shared_note(void *p, size_t n)
{
    sched *s = t_s;
    if (!s || !t_cur)
        return 0; /* namespace-scope declaration, initialised on the host */
    for (auto &e : s->notes)
        if (e.first == p) {
            if (e.second != s->epoch) {
                e.second = s->epoch;
                memset(p, ZS_EMU_POISON, n);
            }
            return 0;
        }
    s->notes.emplace_back(p, s->epoch);
    memset(p, ZS_EMU_POISON, n);
    return 0;
}

/* The launch (CUDA C++ Programming Guide, Execution Configuration; CUDA
 * Runtime API, 6.8 Execution Control). Limits are those of compute
 * capability 9.0 (Programming Guide, Compute Capabilities, Table
 * "Technical Specifications per Compute Capability"). An invalid
 * configuration launches nothing and is reported, as on a GPU, only
 * through the thread's last error (cudaGetLastError). */

} // extern "C"
