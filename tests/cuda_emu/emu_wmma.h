/*
 * emu_wmma.h - the warp matrix functions (namespace nvcuda::wmma, NVIDIA's
 * <mma.h>) for the CUDA emulator (tests/cuda_emu/). emu_shim.h includes it,
 * so every .cu compiled for the emulator has them, whether or not it
 * includes <mma.h>. Written from the CUDA C++ Programming Guide, "Warp
 * Matrix Functions" (Description, Alternate Floating Point, Restrictions,
 * Element Types and Matrix Sizes, Example), and declared like CUDA 13's
 * crt/mma.h, so code written against the real header compiles unchanged:
 * the same tags (matrix_a, matrix_b, accumulator, row_major, col_major),
 * layout_t, __frag_base (num_elements, num_storage_elements, x[]), the
 * same fragment specializations with the same num_elements, and
 * fill_fragment, load_matrix_sync (both overloads), store_matrix_sync and
 * mma_sync.
 *
 * NVIDIA's <mma.h> is kept out twice over: its body compiles only under
 * nvcc (`#if defined(__cplusplus) && defined(__CUDACC__)`, which g++ never
 * defines), and this header defines its include guard __CUDA_MMA_H__, so a
 * later `#include <mma.h>` adds nothing.
 *
 * Each function passes a description of the call (fragment types, this
 * lane's x[], pointer, ldm, layout, call site) to zs_emu_wmma()
 * (emu_wmma.cpp), which makes the call a rendezvous of the 32 lanes, checks
 * them and does the operation once for the warp. The call site comes from
 * __builtin_FILE()/__builtin_LINE() in a defaulted trailing argument (no
 * macros, so `wmma::mma_sync(...)` and `using namespace` both work).
 *
 * Emulated: __half and __nv_bfloat16 matrix_a/matrix_b, float and __half
 * accumulators (bf16 with float only, as in the header), shapes m16n16k16,
 * m32n8k16, m8n32k16. Declared so that code compiles, but a zs_emu_fatal at
 * run time naming the call: the integer (signed/unsigned char, int),
 * precision::tf32 (and __float_to_tf32), double and experimental sub-byte
 * fragments. Fragments start poisoned (all bits set: NaN for the float
 * types).
 */
#ifndef ZS_EMU_WMMA_H
#define ZS_EMU_WMMA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

/* NVIDIA's crt/mma.h include guard: a later #include <mma.h> is empty. */
#ifndef __CUDA_MMA_H__
#define __CUDA_MMA_H__
#endif

/* ---- The contract with emu_wmma.cpp ---- */
enum { ZS_EMU_WMMA_LOAD, ZS_EMU_WMMA_STORE, ZS_EMU_WMMA_FILL, ZS_EMU_WMMA_MMA, ZS_EMU_WMMA_TF32 };
enum { ZS_EMU_WMMA_A, ZS_EMU_WMMA_B, ZS_EMU_WMMA_ACC };
enum {
    ZS_EMU_WMMA_F16,
    ZS_EMU_WMMA_BF16,
    ZS_EMU_WMMA_F32,
    ZS_EMU_WMMA_S8,
    ZS_EMU_WMMA_U8,
    ZS_EMU_WMMA_S32,
    ZS_EMU_WMMA_TF32T,
    ZS_EMU_WMMA_F64,
    ZS_EMU_WMMA_U4,
    ZS_EMU_WMMA_S4,
    ZS_EMU_WMMA_B1
};
/* A fragment type: fragment<use, m, n, k, type, layout>; layout 0 row_major,
 * 1 col_major, -1 none (accumulators). */
struct zs_emu_wmma_frag {
    int use, m, n, k, type, layout;
    int ne;    /* num_elements */
    int nst;   /* num_storage_elements */
    int esize; /* sizeof(storage_element_type) */
};
/* One lane's call. f/x: LOAD, STORE, FILL use [0]; MMA uses d, a, b, c. */
struct zs_emu_wmma_call {
    int op;
    const char *file;
    int line;
    zs_emu_wmma_frag f[4];
    void *x[4];      /* this lane's fragments' x[] */
    const void *ptr; /* LOAD/STORE: mptr */
    unsigned ldm;
    int mem_layout;        /* 0 row-major, 1 col-major (the fragment's own for A/B) */
    unsigned char fill[8]; /* FILL: the value's bits */
    int satf;              /* MMA: -1 without the argument, else its value */
    uint32_t count;        /* set by emu_wmma.cpp */
};
extern "C" {
/* Do one lane's part of a warp matrix function (emu_wmma.cpp): returns
 * when the warp's operation is done, with this lane's fragments updated;
 * zs_emu_fatal for anything undefined. Called only from kernel threads. */
void zs_emu_wmma(zs_emu_wmma_call *c);
}

/* The call site, filled in at the caller by the defaulted argument.
 * explicit: a stray 0 or NULL argument cannot turn into one. */
struct zs_emu_wmma_at {
    const char *file;
    int line;
    explicit zs_emu_wmma_at(const char *f = __builtin_FILE(), int l = __builtin_LINE())
        : file(f), line(l)
    {
    }
};

namespace nvcuda
{
namespace wmma
{

/* ---- Tags, layouts (Programming Guide, Warp Matrix Functions,
 * Description). Incomplete, as in NVIDIA's header. */
struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
namespace precision
{
struct tf32;
}
namespace experimental
{
namespace precision
{
struct u4;
struct s4;
struct b1;
} // namespace precision
enum bmmaBitOp { bmmaBitOpXOR = 1, bmmaBitOpAND = 2 };
enum bmmaAccumulateOp { bmmaAccumulateOpPOPC = 1 };
} // namespace experimental

enum layout_t { mem_row_major, mem_col_major };

template <typename T> struct helper_traits {
    typedef T element_type;
    typedef T storage_element_type;
    typedef T fill_argument_type;
};
template <> struct helper_traits<experimental::precision::u4> {
    typedef experimental::precision::u4 element_type;
    typedef unsigned int storage_element_type;
    typedef unsigned int fill_argument_type;
};
template <> struct helper_traits<experimental::precision::s4> {
    typedef experimental::precision::s4 element_type;
    typedef int storage_element_type;
    typedef int fill_argument_type;
};
template <> struct helper_traits<experimental::precision::b1> {
    typedef experimental::precision::b1 element_type;
    typedef unsigned int storage_element_type;
    typedef unsigned int fill_argument_type;
};
template <> struct helper_traits<precision::tf32> {
    typedef precision::tf32 element_type;
    typedef float storage_element_type;
    typedef float fill_argument_type;
};

/* The fragment's storage, as in NVIDIA's header. "Fragments ... read
 * before being written" hold whatever the registers held: here they start
 * with every bit set (NaN for __half, __nv_bfloat16, float), as the
 * emulator poisons shared memory. */
template <typename T, int size, int packed_size = size> struct alignas(8) __frag_base {
    enum { num_elements = size };
    enum { num_storage_elements = packed_size };
    typedef T element_type;
    typedef typename helper_traits<T>::storage_element_type storage_element_type;
    storage_element_type x[num_storage_elements];
    __frag_base()
    {
        std::memset(static_cast<void *>(x), 0xFF, sizeof x);
    }
};

/* Only the combinations NVIDIA's header specializes exist (Element Types
 * and Matrix Sizes); any other is an incomplete type, as there. */
template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;

#define ZS_EMU_WMMA_FRAG(use, m, n, k, T, L, ...)                                                  \
    template <> class fragment<use, m, n, k, T, L> : public __frag_base<T, __VA_ARGS__>            \
    {                                                                                              \
    };
#define ZS_EMU_WMMA_FRAG_AB(m, n, k, T, nea, neb)                                                  \
    ZS_EMU_WMMA_FRAG(matrix_a, m, n, k, T, row_major, nea)                                         \
    ZS_EMU_WMMA_FRAG(matrix_a, m, n, k, T, col_major, nea)                                         \
    ZS_EMU_WMMA_FRAG(matrix_b, m, n, k, T, row_major, neb)                                         \
    ZS_EMU_WMMA_FRAG(matrix_b, m, n, k, T, col_major, neb)
/* m16n16k16 */
ZS_EMU_WMMA_FRAG_AB(16, 16, 16, __half, 16, 16)
ZS_EMU_WMMA_FRAG(accumulator, 16, 16, 16, __half, void, 8)
ZS_EMU_WMMA_FRAG(accumulator, 16, 16, 16, float, void, 8)
ZS_EMU_WMMA_FRAG_AB(16, 16, 16, signed char, 8, 8)
ZS_EMU_WMMA_FRAG_AB(16, 16, 16, unsigned char, 8, 8)
ZS_EMU_WMMA_FRAG(accumulator, 16, 16, 16, int, void, 8)
ZS_EMU_WMMA_FRAG_AB(16, 16, 16, __nv_bfloat16, 8, 8)
/* m32n8k16 */
ZS_EMU_WMMA_FRAG_AB(32, 8, 16, __half, 16, 16)
ZS_EMU_WMMA_FRAG(accumulator, 32, 8, 16, __half, void, 8)
ZS_EMU_WMMA_FRAG(accumulator, 32, 8, 16, float, void, 8)
ZS_EMU_WMMA_FRAG_AB(32, 8, 16, signed char, 16, 4)
ZS_EMU_WMMA_FRAG_AB(32, 8, 16, unsigned char, 16, 4)
ZS_EMU_WMMA_FRAG(accumulator, 32, 8, 16, int, void, 8)
ZS_EMU_WMMA_FRAG_AB(32, 8, 16, __nv_bfloat16, 16, 4)
/* m8n32k16 */
ZS_EMU_WMMA_FRAG_AB(8, 32, 16, __half, 16, 16)
ZS_EMU_WMMA_FRAG(accumulator, 8, 32, 16, __half, void, 8)
ZS_EMU_WMMA_FRAG(accumulator, 8, 32, 16, float, void, 8)
ZS_EMU_WMMA_FRAG_AB(8, 32, 16, signed char, 4, 16)
ZS_EMU_WMMA_FRAG_AB(8, 32, 16, unsigned char, 4, 16)
ZS_EMU_WMMA_FRAG(accumulator, 8, 32, 16, int, void, 8)
ZS_EMU_WMMA_FRAG_AB(8, 32, 16, __nv_bfloat16, 4, 16)
/* m8n8k32, m8n8k128 (experimental sub-byte) */
ZS_EMU_WMMA_FRAG(matrix_a, 8, 8, 32, experimental::precision::u4, row_major, 8, 1)
ZS_EMU_WMMA_FRAG(matrix_a, 8, 8, 32, experimental::precision::s4, row_major, 8, 1)
ZS_EMU_WMMA_FRAG(matrix_b, 8, 8, 32, experimental::precision::u4, col_major, 8, 1)
ZS_EMU_WMMA_FRAG(matrix_b, 8, 8, 32, experimental::precision::s4, col_major, 8, 1)
ZS_EMU_WMMA_FRAG(accumulator, 8, 8, 32, int, void, 2)
ZS_EMU_WMMA_FRAG(matrix_a, 8, 8, 128, experimental::precision::b1, row_major, 32, 1)
ZS_EMU_WMMA_FRAG(matrix_b, 8, 8, 128, experimental::precision::b1, col_major, 32, 1)
ZS_EMU_WMMA_FRAG(accumulator, 8, 8, 128, int, void, 2)
/* m16n16k8 (tf32), m8n8k4 (double) */
ZS_EMU_WMMA_FRAG_AB(16, 16, 8, precision::tf32, 4, 4)
ZS_EMU_WMMA_FRAG(accumulator, 16, 16, 8, float, void, 8)
ZS_EMU_WMMA_FRAG_AB(8, 8, 4, double, 1, 1)
ZS_EMU_WMMA_FRAG(accumulator, 8, 8, 4, double, void, 2)
#undef ZS_EMU_WMMA_FRAG_AB
#undef ZS_EMU_WMMA_FRAG

} // namespace wmma
} // namespace nvcuda

/* ---- Helpers turning a fragment type into its description ---- */
namespace zs_emu_wmma_detail
{
namespace w = nvcuda::wmma;
template <class U> constexpr int use_id()
{
    return std::is_same<U, w::matrix_a>::value   ? ZS_EMU_WMMA_A
           : std::is_same<U, w::matrix_b>::value ? ZS_EMU_WMMA_B
                                                 : ZS_EMU_WMMA_ACC;
}
template <class T> constexpr int type_id()
{
    return std::is_same<T, __half>::value                           ? ZS_EMU_WMMA_F16
           : std::is_same<T, __nv_bfloat16>::value                  ? ZS_EMU_WMMA_BF16
           : std::is_same<T, float>::value                          ? ZS_EMU_WMMA_F32
           : std::is_same<T, signed char>::value                    ? ZS_EMU_WMMA_S8
           : std::is_same<T, unsigned char>::value                  ? ZS_EMU_WMMA_U8
           : std::is_same<T, int>::value                            ? ZS_EMU_WMMA_S32
           : std::is_same<T, w::precision::tf32>::value             ? ZS_EMU_WMMA_TF32T
           : std::is_same<T, double>::value                         ? ZS_EMU_WMMA_F64
           : std::is_same<T, w::experimental::precision::u4>::value ? ZS_EMU_WMMA_U4
           : std::is_same<T, w::experimental::precision::s4>::value ? ZS_EMU_WMMA_S4
                                                                    : ZS_EMU_WMMA_B1;
}
template <class L> constexpr int layout_id()
{
    return std::is_same<L, w::row_major>::value ? 0 : std::is_same<L, w::col_major>::value ? 1 : -1;
}
/* The pointer type of load/store: the element type, float for tf32,
 * void for the sub-byte types (as in NVIDIA's header). */
template <class T> struct ptr {
    typedef T type;
};
template <> struct ptr<w::precision::tf32> {
    typedef float type;
};
template <> struct ptr<w::experimental::precision::u4> {
    typedef void type;
};
template <> struct ptr<w::experimental::precision::s4> {
    typedef void type;
};
template <> struct ptr<w::experimental::precision::b1> {
    typedef void type;
};
template <class Use, int m, int n, int k, class T, class L>
inline zs_emu_wmma_frag desc(const w::fragment<Use, m, n, k, T, L> &f)
{
    typedef w::fragment<Use, m, n, k, T, L> F;
    return zs_emu_wmma_frag{use_id<Use>(),
                            m,
                            n,
                            k,
                            type_id<T>(),
                            layout_id<L>(),
                            (int)F::num_elements,
                            (int)F::num_storage_elements,
                            (int)sizeof(f.x[0])};
}
inline zs_emu_wmma_call call(int op, const zs_emu_wmma_at &at)
{
    zs_emu_wmma_call c;
    std::memset(&c, 0, sizeof c);
    c.op = op;
    c.file = at.file;
    c.line = at.line;
    c.satf = -1;
    return c;
}
/* The (D, C) accumulator types NVIDIA's header pairs with A/B of type T
 * (Element Types and Matrix Sizes; Alternate Floating Point: "Matrix
 * fragments with __nv_bfloat16 data types are required to be composed with
 * accumulators of float type"). */
template <class T, class TC, class TD> constexpr bool mma_types_ok()
{
    return std::is_same<T, __half>::value
               ? (std::is_same<TC, __half>::value || std::is_same<TC, float>::value) &&
                     (std::is_same<TD, __half>::value || std::is_same<TD, float>::value)
           : std::is_same<T, signed char>::value || std::is_same<T, unsigned char>::value ||
                   std::is_same<T, w::experimental::precision::u4>::value ||
                   std::is_same<T, w::experimental::precision::s4>::value ||
                   std::is_same<T, w::experimental::precision::b1>::value
               ? std::is_same<TC, int>::value && std::is_same<TD, int>::value
           : std::is_same<T, double>::value
               ? std::is_same<TC, double>::value && std::is_same<TD, double>::value
               : std::is_same<TC, float>::value && std::is_same<TD, float>::value;
}
template <class T> constexpr bool is_int_input()
{
    return std::is_same<T, signed char>::value || std::is_same<T, unsigned char>::value ||
           std::is_same<T, w::experimental::precision::u4>::value ||
           std::is_same<T, w::experimental::precision::s4>::value;
}
} // namespace zs_emu_wmma_detail

namespace nvcuda
{
namespace wmma
{

/* fill_fragment (Description): every element of a takes v. A warp
 * rendezvous in the emulator, and all lanes must pass the same v (see
 * emu_wmma.cpp: stricter than documented). */
template <class Use, int m, int n, int k, class T, class L>
inline void fill_fragment(fragment<Use, m, n, k, T, L> &a,
                          const typename helper_traits<T>::fill_argument_type &v,
                          zs_emu_wmma_at at = zs_emu_wmma_at())
{
    static_assert(sizeof v <= 8, "fill value");
    zs_emu_wmma_call c = zs_emu_wmma_detail::call(ZS_EMU_WMMA_FILL, at);
    c.f[0] = zs_emu_wmma_detail::desc(a);
    c.x[0] = a.x;
    std::memcpy(c.fill, static_cast<const void *>(&v), sizeof v);
    zs_emu_wmma(&c);
}

/* load_matrix_sync for matrix_a / matrix_b (Description): the layout is
 * the fragment's. mptr 256-bit aligned, ldm a multiple of 16 bytes. */
template <class Use, int m, int n, int k, class T, class L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L> &a,
                             const typename zs_emu_wmma_detail::ptr<T>::type *mptr, unsigned ldm,
                             zs_emu_wmma_at at = zs_emu_wmma_at())
{
    static_assert(!std::is_same<Use, accumulator>::value,
                  "nvcuda::wmma::load_matrix_sync: an accumulator fragment takes a layout_t "
                  "argument (mem_row_major or mem_col_major)");
    zs_emu_wmma_call c = zs_emu_wmma_detail::call(ZS_EMU_WMMA_LOAD, at);
    c.f[0] = zs_emu_wmma_detail::desc(a);
    c.x[0] = a.x;
    c.ptr = mptr;
    c.ldm = ldm;
    c.mem_layout = zs_emu_wmma_detail::layout_id<L>();
    zs_emu_wmma(&c);
}

/* load_matrix_sync for an accumulator: layout mem_row_major or
 * mem_col_major (Description). */
template <int m, int n, int k, class T>
inline void load_matrix_sync(fragment<accumulator, m, n, k, T> &a,
                             const typename zs_emu_wmma_detail::ptr<T>::type *mptr, unsigned ldm,
                             layout_t layout, zs_emu_wmma_at at = zs_emu_wmma_at())
{
    zs_emu_wmma_call c = zs_emu_wmma_detail::call(ZS_EMU_WMMA_LOAD, at);
    c.f[0] = zs_emu_wmma_detail::desc(a);
    c.x[0] = a.x;
    c.ptr = mptr;
    c.ldm = ldm;
    c.mem_layout = (int)layout;
    zs_emu_wmma(&c);
}

/* store_matrix_sync (Description): accumulators only. */
template <int m, int n, int k, class T>
inline void store_matrix_sync(typename zs_emu_wmma_detail::ptr<T>::type *mptr,
                              const fragment<accumulator, m, n, k, T> &a, unsigned ldm,
                              layout_t layout, zs_emu_wmma_at at = zs_emu_wmma_at())
{
    zs_emu_wmma_call c = zs_emu_wmma_detail::call(ZS_EMU_WMMA_STORE, at);
    c.f[0] = zs_emu_wmma_detail::desc(a);
    c.x[0] = const_cast<void *>(static_cast<const void *>(a.x));
    c.ptr = mptr;
    c.ldm = ldm;
    c.mem_layout = (int)layout;
    zs_emu_wmma(&c);
}

/* mma_sync (Description): d = a * b + c, d may be c. */
template <int m, int n, int k, class TD, class TA, class LA, class TB, class LB, class TC>
inline void
zs_emu_mma_(fragment<accumulator, m, n, k, TD> &d, const fragment<matrix_a, m, n, k, TA, LA> &a,
            const fragment<matrix_b, m, n, k, TB, LB> &b,
            const fragment<accumulator, m, n, k, TC> &c, int satf, const zs_emu_wmma_at &at)
{
    static_assert(std::is_same<TA, TB>::value,
                  "nvcuda::wmma::mma_sync: matrix_a and matrix_b element types differ");
    static_assert(zs_emu_wmma_detail::mma_types_ok<TA, TC, TD>(),
                  "nvcuda::wmma::mma_sync: accumulator types not allowed with these inputs "
                  "(__nv_bfloat16 and tf32 need float accumulators)");
    zs_emu_wmma_call cl = zs_emu_wmma_detail::call(ZS_EMU_WMMA_MMA, at);
    cl.f[0] = zs_emu_wmma_detail::desc(d);
    cl.f[1] = zs_emu_wmma_detail::desc(a);
    cl.f[2] = zs_emu_wmma_detail::desc(b);
    cl.f[3] = zs_emu_wmma_detail::desc(c);
    cl.x[0] = d.x;
    cl.x[1] = const_cast<void *>(static_cast<const void *>(a.x));
    cl.x[2] = const_cast<void *>(static_cast<const void *>(b.x));
    cl.x[3] = const_cast<void *>(static_cast<const void *>(c.x));
    cl.satf = satf;
    zs_emu_wmma(&cl);
}
template <int m, int n, int k, class TD, class TA, class LA, class TB, class LB, class TC>
inline void
mma_sync(fragment<accumulator, m, n, k, TD> &d, const fragment<matrix_a, m, n, k, TA, LA> &a,
         const fragment<matrix_b, m, n, k, TB, LB> &b, const fragment<accumulator, m, n, k, TC> &c,
         zs_emu_wmma_at at = zs_emu_wmma_at())
{
    zs_emu_mma_(d, a, b, c, -1, at);
}
/* satf: declared by NVIDIA's header for the integer forms only (not
 * emulated: a zs_emu_fatal at run time). */
template <int m, int n, int k, class TD, class TA, class LA, class TB, class LB, class TC>
inline void
mma_sync(fragment<accumulator, m, n, k, TD> &d, const fragment<matrix_a, m, n, k, TA, LA> &a,
         const fragment<matrix_b, m, n, k, TB, LB> &b, const fragment<accumulator, m, n, k, TC> &c,
         bool satf, zs_emu_wmma_at at = zs_emu_wmma_at())
{
    static_assert(zs_emu_wmma_detail::is_int_input<TA>(),
                  "nvcuda::wmma::mma_sync: satf exists only for the integer fragments");
    zs_emu_mma_(d, a, b, c, satf ? 1 : 0, at);
}
/* The b1 form (not emulated). */
inline void mma_sync(fragment<accumulator, 8, 8, 128, int> &d,
                     const fragment<matrix_a, 8, 8, 128, experimental::precision::b1, row_major> &a,
                     const fragment<matrix_b, 8, 8, 128, experimental::precision::b1, col_major> &b,
                     const fragment<accumulator, 8, 8, 128, int> &c, experimental::bmmaBitOp op,
                     experimental::bmmaAccumulateOp acc = experimental::bmmaAccumulateOpPOPC,
                     zs_emu_wmma_at at = zs_emu_wmma_at())
{
    (void)op;
    (void)acc;
    zs_emu_mma_(d, a, b, c, -1, at);
}

/* __float_to_tf32 (Alternate Floating Point): not emulated, zs_emu_fatal. */
inline float __float_to_tf32(float in, zs_emu_wmma_at at = zs_emu_wmma_at())
{
    zs_emu_wmma_call c = zs_emu_wmma_detail::call(ZS_EMU_WMMA_TF32, at);
    zs_emu_wmma(&c);
    return in;
}

} // namespace wmma
} // namespace nvcuda

#endif
