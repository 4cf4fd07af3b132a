/*
 * test_emu_cub.cpp - the emulated cub::DeviceRadixSort (tests/cuda_emu/
 * include/cub, emu_cub_sort.cpp) against a qsort-based stable reference:
 * int32/uint32/int64/uint64/float/double keys with int32 (and int64)
 * values, negative keys, bit ranges, duplicates, -0.0, the size query (no
 * work done), too-small temporary storage, scribbled temporary storage,
 * stream-ordered execution, and the emulator's fatal stop on overlapping
 * ranges and host pointers.
 *
 * Does not: run on a GPU or compare with real CUB.
 */
#include <cub/cub.cuh>

/* Work is asynchronous; a sticky error shows at the next synchronisation. */
static cudaError_t sticky()
{
    return cudaDeviceSynchronize();
}

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <type_traits>
#include <unistd.h>
#include <vector>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                   \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd()
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

template <typename T> static T *dalloc(size_t n)
{
    void *p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(T) + 1) == cudaSuccess);
    return static_cast<T *>(p);
}

/* The documented order-preserving transformation, written out per type
 * (CUB docs, "Type Specific Bitwise Transformations" and "Floating-Point
 * Special Cases"), independently of emu_cub_sort.cpp's. */
template <typename K> static uint64_t ordered_bits(K k)
{
    if constexpr (std::is_floating_point<K>::value) {
        if (k == 0)
            k = 0; /* -0.0 == +0.0 */
        using U = typename std::conditional<sizeof(K) == 4, uint32_t, uint64_t>::type;
        U u;
        std::memcpy(&u, &k, sizeof(u));
        U sign = U(1) << (sizeof(U) * 8 - 1);
        return (u & sign) ? U(~u) : U(u | sign);
    } else {
        using U = typename std::make_unsigned<K>::type;
        U u = static_cast<U>(k);
        if (std::is_signed<K>::value)
            u ^= U(1) << (sizeof(U) * 8 - 1);
        return u;
    }
}

struct ref_item {
    uint64_t key;
    size_t idx;
};

static int ref_cmp(const void *a, const void *b)
{
    const ref_item *x = static_cast<const ref_item *>(a), *y = static_cast<const ref_item *>(b);
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx; /* stability */
}

template <typename K, typename V>
static void check_sort(const std::vector<K> &keys, int begin_bit, int end_bit)
{
    const size_t n = keys.size();
    std::vector<V> vals(n);
    for (size_t i = 0; i < n; i++)
        vals[i] = static_cast<V>(i * 7 + 1);
    K *dki = dalloc<K>(n), *dko = dalloc<K>(n);
    V *dvi = dalloc<V>(n), *dvo = dalloc<V>(n);
    cudaMemcpy(dki, keys.data(), n * sizeof(K), cudaMemcpyHostToDevice);
    cudaMemcpy(dvi, vals.data(), n * sizeof(V), cudaMemcpyHostToDevice);
    cudaMemset(dko, 0x5a, n * sizeof(K) + 1);

    size_t bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, dki, dko, dvi, dvo, (int)n, begin_bit,
                                          end_bit) == cudaSuccess);
    CHECK(bytes > 0);
    /* the size query did no work */
    std::vector<unsigned char> probe(n * sizeof(K) + 1);
    cudaMemcpy(probe.data(), dko, probe.size(), cudaMemcpyDeviceToHost);
    for (unsigned char c : probe)
        CHECK(c == 0x5a);
    void *temp = dalloc<char>(bytes);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, dki, dko, dvi, dvo, (int)n, begin_bit,
                                          end_bit, (cudaStream_t)0) == cudaSuccess);
    CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    CHECK(sticky() == cudaSuccess);
    std::vector<K> ko(n);
    std::vector<V> vo(n);
    cudaMemcpy(ko.data(), dko, n * sizeof(K), cudaMemcpyDeviceToHost);
    cudaMemcpy(vo.data(), dvo, n * sizeof(V), cudaMemcpyDeviceToHost);

    std::vector<ref_item> ref(n);
    const int width = end_bit - begin_bit;
    const uint64_t mask = width >= 64 ? ~0ull : (1ull << width) - 1;
    for (size_t i = 0; i < n; i++)
        ref[i] = {width ? (ordered_bits(keys[i]) >> begin_bit) & mask : 0, i};
    std::qsort(ref.data(), n, sizeof(ref_item), ref_cmp);
    for (size_t i = 0; i < n; i++) {
        K want = keys[ref[i].idx];
        if constexpr (std::is_floating_point<K>::value) {
            if (want == 0)
                want = 0; /* -0.0 comes out as +0.0 */
        }
        if (std::memcmp(&ko[i], &want, sizeof(K)) != 0 || vo[i] != vals[ref[i].idx]) {
            std::fprintf(stderr,
                         "FAIL sizeof(K)=%zu n=%zu bits [%d,%d) at %zu: key %.17g want %.17g\n",
                         sizeof(K), n, begin_bit, end_bit, i, (double)ko[i], (double)want);
            std::exit(1);
        }
    }
    /* the input was not altered ("The contents of the input data are not
     * altered by the sorting operation") */
    std::vector<K> ki(n);
    cudaMemcpy(ki.data(), dki, n * sizeof(K), cudaMemcpyDeviceToHost);
    CHECK(n == 0 || std::memcmp(ki.data(), keys.data(), n * sizeof(K)) == 0);
    /* the temporary storage was scribbled */
    unsigned char t0 = 0;
    cudaMemcpy(&t0, temp, 1, cudaMemcpyDeviceToHost);
    CHECK(t0 == 0xa5);
    cudaFree(temp);
    cudaFree(dki), cudaFree(dko), cudaFree(dvi), cudaFree(dvo);
}

template <typename K> static std::vector<K> random_keys(size_t n, uint64_t range, bool negative)
{
    std::vector<K> k(n);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = range ? rnd() % range : rnd();
        if constexpr (std::is_floating_point<K>::value)
            k[i] = static_cast<K>((double)(int64_t)(r % 2001) / 8.0 - (negative ? 125.0 : 0.0));
        else if (negative && std::is_signed<K>::value)
            k[i] = static_cast<K>(static_cast<int64_t>(r) - static_cast<int64_t>(range / 2));
        else
            k[i] = static_cast<K>(r);
    }
    return k;
}

static void test_sorts()
{
    int count = 0;
    const size_t sizes[] = {0, 1, 2, 7, 1000, 4099};
    for (size_t n : sizes) {
        for (int dup = 0; dup < 2; dup++) {
            uint64_t range = dup ? 16 : 0;
            auto i32 = random_keys<int32_t>(n, range ? range : 1ull << 32, true);
            check_sort<int32_t, int32_t>(i32, 0, 32), count++;
            check_sort<int32_t, int32_t>(i32, 0, 8), count++;
            check_sort<int32_t, int32_t>(i32, 4, 20), count++;
            check_sort<int32_t, int32_t>(i32, 16, 32), count++;
            check_sort<int32_t, int32_t>(i32, 31, 32), count++; /* sign only */
            check_sort<int32_t, int32_t>(i32, 5, 5), count++;   /* nothing: stable copy */
            auto u32 = random_keys<uint32_t>(n, range, false);
            check_sort<uint32_t, int32_t>(u32, 0, 32), count++;
            check_sort<uint32_t, int32_t>(u32, 3, 11), count++;
            auto i64 = random_keys<int64_t>(n, range ? range : (1ull << 63), true);
            check_sort<int64_t, int32_t>(i64, 0, 64), count++;
            check_sort<int64_t, int64_t>(i64, 0, 64), count++;
            check_sort<int64_t, int32_t>(i64, 20, 63), count++;
            auto u64 = random_keys<uint64_t>(n, range, false);
            check_sort<uint64_t, int32_t>(u64, 0, 64), count++;
            auto f = random_keys<float>(n, 0, true);
            if (n > 3) {
                f[0] = -0.0f;
                f[1] = 0.0f;
                f[2] = -0.0f;
            }
            check_sort<float, int32_t>(f, 0, 32), count++;
            auto d = random_keys<double>(n, 0, true);
            check_sort<double, int32_t>(d, 0, 64), count++;
        }
    }
    /* the embedding backward's shape: int32 token ids, int32 positions */
    std::vector<int32_t> tok(5000);
    for (auto &t : tok)
        t = (int32_t)(rnd() % 50257);
    check_sort<int32_t, int32_t>(tok, 0, 16), count++; /* wrong bit range: only low bits */
    check_sort<int32_t, int32_t>(tok, 0, 32), count++;
    std::printf("sorts: %d match the stable reference\n", count);
}

static std::atomic<int> g_gate;

static void CUDART_CB gate_fn(void *)
{
    while (!g_gate.load())
        usleep(100);
}

static void test_temp_storage()
{
    const int n = 100;
    int32_t *ki = dalloc<int32_t>(n), *ko = dalloc<int32_t>(n), *vi = dalloc<int32_t>(n),
            *vo = dalloc<int32_t>(n);
    std::vector<int32_t> h(n);
    for (int i = 0; i < n; i++)
        h[i] = n - i;
    cudaMemcpy(ki, h.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice);
    cudaMemcpy(vi, h.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice);
    cudaMemset(ko, 0, sizeof(int32_t) * n);
    size_t bytes = 0, zero_bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, ki, ko, vi, vo, n) == cudaSuccess);
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, zero_bytes, ki, ko, vi, vo, 0) == cudaSuccess);
    CHECK(zero_bytes > 0); /* nonzero even for no items */
    CHECK(bytes > zero_bytes);
    char *temp = dalloc<char>(bytes);
    size_t small = bytes - 1;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, small, ki, ko, vi, vo, n) == cudaErrorInvalidValue);
    /* storage sized for fewer items */
    CHECK(cub::DeviceRadixSort::SortPairs(temp, zero_bytes, ki, ko, vi, vo, n) ==
          cudaErrorInvalidValue);
    std::vector<int32_t> out(n);
    cudaMemcpy(out.data(), ko, sizeof(int32_t) * n, cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++)
        CHECK(out[i] == 0); /* refused calls did nothing */
    /* bad bit ranges */
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ki, ko, vi, vo, n, 0, 33) ==
          cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ki, ko, vi, vo, n, 9, 8) ==
          cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ki, ko, vi, vo, -1) ==
          cudaErrorInvalidValue);

    /* stream order: the sort runs after the call returns, in stream order
     * (behind a host function that holds the stream until we open it) */
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    g_gate = 0;
    CHECK(cudaLaunchHostFunc(st, gate_fn, nullptr) == cudaSuccess);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ki, ko, vi, vo, n, 0, 32, st) ==
          cudaSuccess);
    int32_t k0 = -1;
    cudaMemcpy(&k0, ko, sizeof(k0), cudaMemcpyDeviceToHost); /* legacy stream: no wait on st */
    CHECK(k0 == 0);
    g_gate = 1;
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    CHECK(cudaStreamDestroy(st) == cudaSuccess);
    int32_t first[2], last;
    cudaMemcpy(first, ko, sizeof(first), cudaMemcpyDeviceToHost);
    cudaMemcpy(&last, ko + n - 1, sizeof(last), cudaMemcpyDeviceToHost);
    CHECK(first[0] == 1 && first[1] == 2 && last == n);
    cudaMemcpy(first, vo, sizeof(first), cudaMemcpyDeviceToHost);
    CHECK(first[0] == 1);

    /* SortKeys */
    cudaMemset(ko, 0, sizeof(int32_t) * n);
    CHECK(cub::DeviceRadixSort::SortKeys(temp, bytes, ki, ko, n) == cudaSuccess);
    cudaMemcpy(first, ko, sizeof(first), cudaMemcpyDeviceToHost);
    cudaMemcpy(&last, ko + n - 1, sizeof(last), cudaMemcpyDeviceToHost);
    CHECK(first[0] == 1 && last == n);
    cudaFree(temp), cudaFree(ki), cudaFree(ko), cudaFree(vi), cudaFree(vo);
    std::printf("temp storage: ok\n");
}

/* The child must die of SIGABRT (zs_emu_fatal). */
template <typename F> static void expect_fatal(F f)
{
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* executors idle at fork */
    std::fflush(nullptr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        CHECK(std::freopen("/dev/null", "w", stderr));
        f();
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void test_fatal()
{
    /* Everything is allocated before fork: the child only makes the call
     * that must stop it (a runtime with executor threads is not safe to use
     * in a forked child). */
    const int n = 64;
    int32_t *ki = dalloc<int32_t>(n), *ko = dalloc<int32_t>(n), *vi = dalloc<int32_t>(2 * n),
            *vo = dalloc<int32_t>(n);
    size_t bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, ki, ko, vi, vo, n) == cudaSuccess);
    void *t = dalloc<char>(bytes), *t16 = dalloc<char>(16);
    static int32_t hk[n], ho[n], hv[n], hw[n];
    expect_fatal([&] { /* in place: keys out == keys in */
                       cub::DeviceRadixSort::SortPairs(t, bytes, ki, ki, vi, vo, n);
    });
    expect_fatal([&] { /* values out overlapping values in by one element */
                       cub::DeviceRadixSort::SortPairs(t, bytes, ki, ko, vi, vi + n - 1, n);
    });
    char *big = dalloc<char>(bytes + 4096);
    expect_fatal([&] { /* temporary storage overlapping the keys */
                       cub::DeviceRadixSort::SortPairs(big, bytes, (const int32_t *)(big + 256), ko,
                                                       vi, vo, n);
    });
    expect_fatal([&] { /* host memory */
                       cub::DeviceRadixSort::SortPairs(t, bytes, hk, ho, hv, hw, n);
    });
    expect_fatal([&] { /* temporary storage smaller than claimed */
                       cub::DeviceRadixSort::SortPairs(t16, bytes, ki, ko, vi, vo, n);
    });
    cudaFree(t), cudaFree(t16), cudaFree(big), cudaFree(ki), cudaFree(ko), cudaFree(vi),
        cudaFree(vo);
    std::printf("fatal on overlap / host pointers: ok\n");
}

int main()
{
    test_temp_storage();
    test_fatal();
    test_sorts();
    std::printf("test_emu_cub: all passed\n");
    return 0;
}
