/*
 * emu_wmma.cpp - the warp matrix functions of the CUDA emulator
 * (tests/cuda_emu/): the library side of emu_wmma.h's nvcuda::wmma
 * (fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync). Source:
 * CUDA C++ Programming Guide, "Warp Matrix Functions" (Description,
 * Alternate Floating Point, Restrictions, Element Types and Matrix Sizes).
 *
 * Every call is a rendezvous of the warp's 32 lanes, built on the fiber
 * scheduler's __syncwarp (zs_emu_syncwarp with the full mask): each lane
 * leaves a pointer to its call description in a per-warp table and waits;
 * the first lane to resume checks that all 32 made the same call (same
 * source line, operation, fragment types, pointer, ldm, layout, fill value,
 * and the same number of earlier calls), then does the operation once for
 * the warp (gathering the lanes' x[] through the element mapping, scattering
 * the results back) and empties the table; the others find their entry
 * gone and return. An exited lane, a partial warp or a lane waiting at a
 * barrier is reported by the scheduler itself (emu_fiber.cpp), with the
 * call named in the file:line.
 *
 * The mapping of matrix elements to (lane, x[i]) is a random surjection
 * per fragment type and per run (ZS_EMU_WMMA_SEED, else derived from
 * ZS_EMU_SCHEDULE), so code that assumes a layout of x[] breaks.
 *
 * Emulated: __half / __nv_bfloat16 inputs, float / __half accumulators,
 * shapes m16n16k16, m32n8k16, m8n32k16. Not emulated (zs_emu_fatal naming
 * the call): integer, tf32, double and sub-byte fragments, satf,
 * __float_to_tf32. Does not model: the asynchrony of stores with respect
 * to other lanes (a store is complete when any lane returns), the exact
 * rounding of a tensor core's adder tree (see mma below).
 */
#include "emu_fiber.h"
#include "emu_wmma.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace
{
using namespace zs_emu;

const char *const op_name[] = {"nvcuda::wmma::load_matrix_sync", "nvcuda::wmma::store_matrix_sync",
                               "nvcuda::wmma::fill_fragment", "nvcuda::wmma::mma_sync",
                               "nvcuda::wmma::__float_to_tf32"};
const char *const type_name[] = {"__half",
                                 "__nv_bfloat16",
                                 "float",
                                 "signed char",
                                 "unsigned char",
                                 "int",
                                 "precision::tf32",
                                 "double",
                                 "experimental::precision::u4",
                                 "experimental::precision::s4",
                                 "experimental::precision::b1"};
const char *const use_name[] = {"matrix_a", "matrix_b", "accumulator"};

uint64_t mix(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* "fragment<matrix_a, 16, 16, 16, __half, row_major>" */
const char *frag_str(const zs_emu_wmma_frag &f, char *b, size_t n)
{
    snprintf(b, n, "fragment<%s, %d, %d, %d, %s%s>", use_name[f.use], f.m, f.n, f.k,
             type_name[f.type],
             f.layout == 0   ? ", row_major"
             : f.layout == 1 ? ", col_major"
                             : "");
    return b;
}

[[noreturn]] void wfatal(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void wfatal(const char *file, int line, const char *fmt, ...)
{
    char where[512], msg[768];
    const launch *L = t_s ? t_s->L : nullptr;
    if (L)
        snprintf(where, sizeof where, "kernel %s (launched at %s:%d), %s:%d", L->name, L->file,
                 L->line, file, line);
    else
        snprintf(where, sizeof where, "%s:%d", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zs_emu_fatal(where, "%s", msg);
}

/* "nvcuda::wmma::mma_sync at <file>": the file name handed to the
 * scheduler's rendezvous, so its diagnostics (an exited lane, barrier
 * divergence) name the call. Interned, never freed. */
const char *site_name(int op, const char *file)
{
    static std::mutex mu;
    static std::map<std::pair<const char *, int>, std::string *> names;
    std::lock_guard<std::mutex> g(mu);
    std::string *&s = names[std::make_pair(file, op)];
    if (!s)
        s = new std::string(std::string(op_name[op]) + " at " + file);
    return s->c_str();
}

/* ---- The element mapping (Description: "The mapping of matrix elements
 * into fragment internal storage is unspecified and subject to change in
 * future architectures"; Restrictions: the developer is "not allowed to
 * make assumptions about how the individual parameters are mapped to the
 * registers"). Hostile: per run and per fragment type, a random
 * surjection from the warp's 32 x num_elements slots onto the matrix's
 * rows x cols elements, each element held by the same number of slots
 * (two for __half matrix_a/matrix_b in m16n16k16: 512 slots, 256
 * elements). A load writes every copy; mma and store read one copy per
 * element (also chosen at random), so uniform element-wise code over x[]
 * works and code that assumes a layout does not. ---- */

/* ZS_EMU_WMMA_SEED, else derived from ZS_EMU_SCHEDULE's kind and seed
 * (forward, reverse and each random:SEED see different mappings). */
uint64_t wmma_seed()
{
    static const uint64_t seed = [] {
        const char *e = getenv("ZS_EMU_WMMA_SEED");
        if (e && *e) {
            char *end;
            unsigned long long v = strtoull(e, &end, 10);
            if (*end)
                zs_emu_fatal("environment", "ZS_EMU_WMMA_SEED=%s: want a decimal number", e);
            return (uint64_t)v;
        }
        return g_seed ^ ((uint64_t)(g_schedule + 1) << 48);
    }();
    return seed;
}

struct mapping {
    int key[6];
    unsigned slots, elems;
    std::vector<uint16_t> elem_of;  /* slot (lane * ne + i) -> element */
    std::vector<uint16_t> canon_of; /* element -> the slot mma/store read */
};

/* Rows and columns of the fragment's matrix: m x k, k x n, m x n. */
void dims(const zs_emu_wmma_frag &f, int *r, int *c)
{
    *r = f.use == ZS_EMU_WMMA_B ? f.k : f.m;
    *c = f.use == ZS_EMU_WMMA_A ? f.k : f.n;
}

/* Per executor thread: no lock. */
thread_local std::vector<mapping *> t_maps;

const mapping *get_map(const zs_emu_wmma_frag &f)
{
    int key[6] = {f.use, f.m, f.n, f.k, f.type, f.layout};
    for (mapping *m : t_maps)
        if (!memcmp(m->key, key, sizeof key))
            return m;
    mapping *m = new mapping();
    memcpy(m->key, key, sizeof key);
    int r, c;
    dims(f, &r, &c);
    m->slots = 32u * (unsigned)f.ne;
    m->elems = (unsigned)(r * c);
    uint64_t s = wmma_seed();
    for (int i = 0; i < 6; i++)
        s = mix(&s) ^ (uint64_t)(unsigned)key[i];
    std::vector<unsigned> p(m->slots);
    for (unsigned i = 0; i < m->slots; i++)
        p[i] = i;
    for (unsigned i = m->slots; i > 1; i--)
        std::swap(p[i - 1], p[(unsigned)(mix(&s) % i)]);
    m->elem_of.resize(m->slots);
    m->canon_of.resize(m->elems);
    for (unsigned i = 0; i < m->slots; i++) {
        m->elem_of[i] = (uint16_t)(p[i] % m->elems);
        if (p[i] < m->elems)
            m->canon_of[p[i]] = (uint16_t)i;
    }
    t_maps.push_back(m);
    return m;
}

/* The order of the k products in mma_sync, per run and shape (the order of
 * a tensor core's additions is not documented). */
const std::vector<int> &k_order(const zs_emu_wmma_frag &a)
{
    static thread_local std::vector<std::pair<int, std::vector<int>>> orders;
    int key = (a.m << 16) | (a.n << 8) | a.k;
    for (auto &o : orders)
        if (o.first == key)
            return o.second;
    uint64_t s = wmma_seed() ^ 0x6b6f72646572ull ^ (uint64_t)key;
    std::vector<int> o(a.k);
    for (int i = 0; i < a.k; i++)
        o[i] = i;
    for (int i = a.k; i > 1; i--)
        std::swap(o[i - 1], o[(int)(mix(&s) % (unsigned)i)]);
    orders.emplace_back(key, o);
    return orders.back().second;
}

/* ---- Emulated types and shapes (Element Types and Matrix Sizes;
 * Alternate Floating Point) ---- */
bool emulated(const zs_emu_wmma_frag &f)
{
    bool shape = (f.m == 16 && f.n == 16 && f.k == 16) || (f.m == 32 && f.n == 8 && f.k == 16) ||
                 (f.m == 8 && f.n == 32 && f.k == 16);
    bool type = f.use == ZS_EMU_WMMA_ACC ? f.type == ZS_EMU_WMMA_F32 || f.type == ZS_EMU_WMMA_F16
                                         : f.type == ZS_EMU_WMMA_F16 || f.type == ZS_EMU_WMMA_BF16;
    int r, c;
    dims(f, &r, &c);
    return shape && type && f.ne == f.nst && (32 * f.ne) % (r * c) == 0;
}

float to_float(const unsigned char *p, int type)
{
    if (type == ZS_EMU_WMMA_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    if (type == ZS_EMU_WMMA_F16) {
        __half h;
        memcpy(static_cast<void *>(&h), p, 2);
        return __half2float(h);
    }
    __nv_bfloat16 b;
    memcpy(static_cast<void *>(&b), p, 2);
    return __bfloat162float(b);
}

float round_half(float v)
{
    return __half2float(__float2half_rn(v));
}

void from_float(unsigned char *p, int type, float v)
{
    if (type == ZS_EMU_WMMA_F32) {
        memcpy(p, &v, 4);
    } else {
        __half h = __float2half_rn(v);
        memcpy(p, static_cast<const void *>(&h), 2);
    }
}

/* ---- Per-warp call table. Block-shared state: one block's fibers run on
 * this executor thread, and zs_emu_shared_note resets it (all bits set)
 * when the first thread of each block reaches it. ---- */
struct warp_table {
    zs_emu_wmma_call *c[32]; /* all bits set: empty */
    uint32_t count[32];      /* calls made by each lane in this block, minus one */
};
thread_local warp_table t_tab[32];
zs_emu_wmma_call *const EMPTY = reinterpret_cast<zs_emu_wmma_call *>(~(uintptr_t)0);

const char *layout_str(int l)
{
    return l == 0 ? "mem_row_major" : l == 1 ? "mem_col_major" : "(bad layout)";
}

/* Checks one lane can do alone, before the rendezvous. */
void check_lane(const zs_emu_wmma_call *c)
{
    char b[160];
    const char *what = op_name[c->op];
    int nf = c->op == ZS_EMU_WMMA_MMA ? 4 : 1;
    for (int i = 0; i < nf; i++)
        if (!emulated(c->f[i]))
            wfatal(c->file, c->line,
                   "%s: %s is not emulated (the emulator has __half and __nv_bfloat16 "
                   "matrix_a/matrix_b with float or __half accumulators, shapes m16n16k16, "
                   "m32n8k16, m8n32k16)",
                   what, frag_str(c->f[i], b, sizeof b));
    if (c->op == ZS_EMU_WMMA_MMA && c->satf >= 0)
        wfatal(c->file, c->line, "%s: satf is not emulated", what);
    if (c->op != ZS_EMU_WMMA_LOAD && c->op != ZS_EMU_WMMA_STORE)
        return;
    /* Description, load_matrix_sync / store_matrix_sync: "mptr must be a
     * 256-bit aligned pointer"; "ldm ... must be a multiple of 8 for __half
     * element type or multiple of 4 for float element type. (i.e., multiple
     * of 16 bytes in both cases)"; the accumulator's layout "must be
     * specified as either mem_row_major or mem_col_major". */
    const zs_emu_wmma_frag &f = c->f[0];
    if ((uintptr_t)c->ptr % 32)
        wfatal(c->file, c->line,
               "%s: mptr %p is not 256-bit (32-byte) aligned (Warp Matrix Functions: \"mptr "
               "must be a 256-bit aligned pointer\")",
               what, c->ptr);
    if ((c->ldm * (unsigned)f.esize) % 16)
        wfatal(c->file, c->line,
               "%s: ldm %u is not a multiple of %d for %s elements (Warp Matrix Functions: "
               "ldm must be a multiple of 16 bytes)",
               what, c->ldm, 16 / f.esize, type_name[f.type]);
    if (c->mem_layout != 0 && c->mem_layout != 1)
        wfatal(c->file, c->line, "%s: layout %d is neither mem_row_major nor mem_col_major", what,
               c->mem_layout);
}

/* The leader's check: lane j made the same call as c (Description: "The
 * values of mptr, ldm, layout and all template parameters for a must be
 * the same for all threads in the warp. This function must be called by
 * all threads in the warp, or the result is undefined"; mma_sync: the
 * template parameters "must be the same for all threads in the warp"). */
void check_same(const zs_emu_wmma_call *c, unsigned lane, unsigned w, unsigned j,
                const zs_emu_wmma_call *o)
{
    const char *what = op_name[c->op];
    unsigned tj = w * 32 + j;
    if (o == EMPTY)
        wfatal(c->file, c->line,
               "%s in lane %u: lane %u (thread %u) is not at this call: it passed a "
               "__syncwarp(0xffffffff) elsewhere while the warp waited here (all 32 lanes must "
               "call warp matrix functions together)",
               what, lane, j, tj);
    if (o->op != c->op || o->line != c->line || (o->file != c->file && strcmp(o->file, c->file)))
        wfatal(c->file, c->line, "%s in lane %u: lane %u (thread %u) is at %s at %s:%d instead",
               what, lane, j, tj, op_name[o->op], o->file, o->line);
    if (o->count != c->count)
        wfatal(c->file, c->line,
               "%s in lane %u: lane %u (thread %u) has made %u warp matrix calls in this block, "
               "lane %u %u: a lane skipped one",
               what, lane, j, tj, o->count + 1, lane, c->count + 1);
    int nf = c->op == ZS_EMU_WMMA_MMA ? 4 : 1;
    for (int i = 0; i < nf; i++)
        if (memcmp(&o->f[i], &c->f[i], sizeof c->f[i])) {
            char b1[160], b2[160];
            wfatal(c->file, c->line,
                   "%s in lane %u: lane %u (thread %u) passes a %s, lane %u a %s (template "
                   "parameters must be the same in all lanes)",
                   what, lane, j, tj, frag_str(o->f[i], b1, sizeof b1), lane,
                   frag_str(c->f[i], b2, sizeof b2));
        }
    if (c->op == ZS_EMU_WMMA_LOAD || c->op == ZS_EMU_WMMA_STORE) {
        if (o->ptr != c->ptr || o->ldm != c->ldm || o->mem_layout != c->mem_layout)
            wfatal(c->file, c->line,
                   "%s in lane %u: lane %u (thread %u) passes mptr %p ldm %u %s, lane %u mptr %p "
                   "ldm %u %s (they must be the same in all lanes)",
                   what, lane, j, tj, o->ptr, o->ldm, layout_str(o->mem_layout), lane, c->ptr,
                   c->ldm, layout_str(c->mem_layout));
    }
    /* fill_fragment is not documented as collective ("ordinarily called by
     * all threads in the warp with a common value for v"): requiring the
     * rendezvous and one value is stricter than documented, as the project
     * asked. Different values per lane would make a matrix that depends on
     * the unspecified mapping. */
    if (c->op == ZS_EMU_WMMA_FILL && memcmp(o->fill, c->fill, (size_t)c->f[0].esize))
        wfatal(c->file, c->line,
               "%s in lane %u: lane %u (thread %u) fills with a different value (the element "
               "mapping is unspecified: use one value for the whole warp)",
               what, lane, j, tj);
}

/* ---- The operations, done once for the warp by the leader. cs[j] is
 * lane j's call. ---- */
thread_local std::vector<unsigned char> t_mat; /* a matrix, row-major, storage bits */

void op_load(zs_emu_wmma_call *const *cs)
{
    const zs_emu_wmma_call *c = cs[0];
    const zs_emu_wmma_frag &f = c->f[0];
    const mapping *m = get_map(f);
    int R, C;
    dims(f, &R, &C);
    size_t es = (size_t)f.esize;
    t_mat.resize((size_t)R * C * es);
    const unsigned char *p = (const unsigned char *)c->ptr;
    /* row-major: element (r, c) at mptr[r * ldm + c]; col-major:
     * mptr[c * ldm + r] (Description: ldm is the stride between rows or
     * columns). */
    for (int r = 0; r < R; r++)
        for (int q = 0; q < C; q++) {
            size_t off = c->mem_layout == 0 ? (size_t)r * c->ldm + q : (size_t)q * c->ldm + r;
            memcpy(&t_mat[((size_t)r * C + q) * es], p + off * es, es);
        }
    for (unsigned s = 0; s < m->slots; s++)
        memcpy((unsigned char *)cs[s / f.ne]->x[0] + (s % f.ne) * es, &t_mat[m->elem_of[s] * es],
               es);
}

void op_store(zs_emu_wmma_call *const *cs)
{
    const zs_emu_wmma_call *c = cs[0];
    const zs_emu_wmma_frag &f = c->f[0];
    const mapping *m = get_map(f);
    int R, C;
    dims(f, &R, &C);
    size_t es = (size_t)f.esize;
    unsigned char *p = (unsigned char *)const_cast<void *>(c->ptr);
    for (int r = 0; r < R; r++)
        for (int q = 0; q < C; q++) {
            unsigned s = m->canon_of[(size_t)r * C + q];
            size_t off = c->mem_layout == 0 ? (size_t)r * c->ldm + q : (size_t)q * c->ldm + r;
            memcpy(p + off * es, (const unsigned char *)cs[s / f.ne]->x[0] + (s % f.ne) * es, es);
        }
}

void op_fill(zs_emu_wmma_call *const *cs)
{
    const zs_emu_wmma_frag &f = cs[0]->f[0];
    for (unsigned j = 0; j < 32; j++)
        for (int i = 0; i < f.ne; i++)
            memcpy((unsigned char *)cs[j]->x[0] + (size_t)i * f.esize, cs[0]->fill,
                   (size_t)f.esize);
}

/* Gather the fragment in x-slot k of every lane into a row-major float
 * matrix (one copy per element). */
void gather(zs_emu_wmma_call *const *cs, int k, std::vector<float> &out)
{
    const zs_emu_wmma_frag &f = cs[0]->f[k];
    const mapping *m = get_map(f);
    out.resize(m->elems);
    for (unsigned e = 0; e < m->elems; e++) {
        unsigned s = m->canon_of[e];
        out[e] = to_float((const unsigned char *)cs[s / f.ne]->x[k] + (s % f.ne) * f.esize, f.type);
    }
}

/* mma_sync (Description): D = A * B + C. Inputs are already of their
 * types (__half / __nv_bfloat16 values, exact in float, and so is each
 * product). The documentation does not say in which order or at which
 * precision the products are summed. Chosen: for each element, start from
 * C, add the k products one at a time in a per-run random order of k
 * (k_order), each addition an IEEE fp32 add (round to nearest even). With
 * a __half D, hostile: the running sum is rounded to __half after every
 * addition (fp32 add, then fp16 round to nearest even), starting from C
 * rounded to __half; nothing documents a wider accumulator for __half
 * results. */
void op_mma(zs_emu_wmma_call *const *cs)
{
    static thread_local std::vector<float> A, B, Cm;
    const zs_emu_wmma_frag &fd = cs[0]->f[0], &fa = cs[0]->f[1];
    gather(cs, 1, A);
    gather(cs, 2, B);
    gather(cs, 3, Cm); /* before D is written: D may be C */
    int M = fa.m, N = fd.n, K = fa.k;
    const std::vector<int> &ko = k_order(fa);
    bool half = fd.type == ZS_EMU_WMMA_F16;
    std::vector<float> D((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = Cm[(size_t)i * N + j];
            if (half)
                s = round_half(s);
            for (int t = 0; t < K; t++) {
                int kk = ko[t];
                float prod = A[(size_t)i * K + kk] * B[(size_t)kk * N + j];
                s = s + prod;
                if (half)
                    s = round_half(s);
            }
            D[(size_t)i * N + j] = s;
        }
    const mapping *m = get_map(fd);
    for (unsigned s = 0; s < m->slots; s++)
        from_float((unsigned char *)cs[s / fd.ne]->x[0] + (s % fd.ne) * fd.esize, fd.type,
                   D[m->elem_of[s]]);
}

} // namespace

extern "C" void zs_emu_wmma(zs_emu_wmma_call *c)
{
    if (!t_s || !t_s->L || !zs_emu_tv)
        wfatal(c->file, c->line, "%s called outside a kernel", op_name[c->op]);
    if (c->op == ZS_EMU_WMMA_TF32)
        wfatal(c->file, c->line, "%s is not emulated", op_name[c->op]);
    check_lane(c);
    unsigned lane = zs_emu_tv->lane;
    unsigned lin =
        zs_emu_tv->tid.x + zs_emu_bdim.x * (zs_emu_tv->tid.y + zs_emu_bdim.y * zs_emu_tv->tid.z);
    unsigned w = lin / 32;
    zs_emu_shared_note(t_tab, sizeof t_tab);
    warp_table &T = t_tab[w];
    c->count = ++T.count[lane];
    T.c[lane] = c;
    /* "Waits until all warp lanes have arrived" (Description): the
     * scheduler's full-mask rendezvous; an exited lane, a partial warp or a
     * lane blocked elsewhere is its zs_emu_fatal, at this call's file:line. */
    zs_emu_syncwarp(0xffffffffu, site_name(c->op, c->file), c->line);
    if (T.c[lane] == EMPTY)
        return; /* the leader has done it */
    for (unsigned j = 0; j < 32; j++)
        if (j != lane)
            check_same(c, lane, w, j, T.c[j]);
    switch (c->op) {
    case ZS_EMU_WMMA_LOAD:
        op_load(T.c);
        break;
    case ZS_EMU_WMMA_STORE:
        op_store(T.c);
        break;
    case ZS_EMU_WMMA_FILL:
        op_fill(T.c);
        break;
    default:
        op_mma(T.c);
        break;
    }
    for (unsigned j = 0; j < 32; j++)
        T.c[j] = EMPTY;
}
