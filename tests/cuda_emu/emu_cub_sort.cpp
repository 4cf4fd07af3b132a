/*
 * emu_cub_sort.cpp - the CUDA emulator's cub::DeviceRadixSort::SortPairs /
 * SortKeys (front end: include/cub/device/device_radix_sort.cuh): argument
 * checks, the temporary-storage size query, and the sort itself, enqueued on
 * the caller's stream with zs_emu_enqueue and run as a stable sort of the
 * transformed, bit-range-masked keys.
 *
 * Source: CUB's DeviceRadixSort documentation (the doc comments of CCCL's
 * cub/device/device_radix_sort.cuh, CUDA 13): "Floating-Point Special
 * Cases", "Transformations", "Type Specific Bitwise Transformations",
 * "Stability", and SortPairs' parameter and overlap rules. Where they leave
 * room we take the most hostile legal reading ("HOSTILE").
 *
 * Does not: sort descending, DoubleBuffer, segmented or custom-decomposer
 * sorts, or model CUB's passes; it is not a radix sort internally (the
 * documented result is what is emulated, not the algorithm).
 */
#include "emu_internal.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace
{

struct sort_job {
    void *temp;
    size_t temp_bytes; /* what the size query asked for: scribbled */
    const void *keys_in;
    void *keys_out;
    const void *vals_in;
    void *vals_out;
    size_t n, key_size, val_size;
    int kind, begin_bit, end_bit, device;
};

size_t round256(size_t x)
{
    return (x + 255) / 256 * 256;
}

/* HOSTILE: the size query answers more than zero even for zero items (a
 * caller that skips the allocation when the size is 0 is relying on
 * something CUB does not promise), and grows with num_items like the "~2N
 * auxiliary storage" SortPairs' docs state, so storage sized for fewer items
 * is refused. */
size_t temp_needed(size_t n, size_t key_size, size_t val_size)
{
    return 1024 + round256(n * key_size) + round256(n * val_size);
}

uint64_t load_key(const void *keys, size_t i, size_t size)
{
    const unsigned char *p = static_cast<const unsigned char *>(keys) + i * size;
    switch (size) {
    case 1:
        return *p;
    case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
    }
    case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
    }
    default: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
    }
    }
}

/* CUB docs, "Type Specific Bitwise Transformations": unsigned keys are used
 * directly; for signed the sign bit is inverted; for positive floating point
 * the sign bit is inverted, for negative floating point the full key is
 * inverted. "Floating-Point Special Cases": positive and negative zero are
 * equivalent (so -0.0 is first made +0.0); NaNs get no special handling
 * (sorted by their bits after the transformation). "Transformations": the
 * transformation happens before the [begin_bit, end_bit) truncation. */
uint64_t twiddle(uint64_t k, size_t size, int kind)
{
    const int bits = static_cast<int>(size * 8);
    const uint64_t sign = 1ull << (bits - 1);
    const uint64_t all = bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (kind == 1)
        return k ^ sign;
    if (kind == 2) {
        if (k == sign) /* -0.0 */
            k = 0;
        return (k & sign) ? (~k & all) : (k ^ sign);
    }
    return k;
}

cudaError_t run_sort(void *arg)
{
    const sort_job *j = static_cast<const sort_job *>(arg);
    /* Freed between the call and now: what a GPU faults on. */
    if (zs_emu_dev_ptr(j->temp, j->temp_bytes) != j->device ||
        (j->n && (zs_emu_dev_ptr(j->keys_in, j->n * j->key_size) != j->device ||
                  zs_emu_dev_ptr(j->keys_out, j->n * j->key_size) != j->device)) ||
        (j->n && j->val_size &&
         (zs_emu_dev_ptr(j->vals_in, j->n * j->val_size) != j->device ||
          zs_emu_dev_ptr(j->vals_out, j->n * j->val_size) != j->device)))
        return cudaErrorIllegalAddress;

    /* HOSTILE: temporary storage is CUB's to use; whatever the caller left
     * there is destroyed. */
    std::memset(j->temp, 0xa5, j->temp_bytes);
    if (j->n == 0)
        return cudaSuccess;

    const int width = j->end_bit - j->begin_bit;
    const uint64_t mask = width >= 64 ? ~0ull : (1ull << width) - 1;
    std::vector<uint64_t> key(j->n);
    std::vector<size_t> idx(j->n);
    for (size_t i = 0; i < j->n; i++) {
        key[i] = (twiddle(load_key(j->keys_in, i, j->key_size), j->key_size, j->kind) >>
                  (j->begin_bit < 64 ? j->begin_bit : 0)) &
                 mask;
        if (width == 0)
            key[i] = 0;
        idx[i] = i;
    }
    /* "DeviceRadixSort is stable": equal (masked) keys keep input order. */
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });

    const unsigned char *kin = static_cast<const unsigned char *>(j->keys_in);
    unsigned char *kout = static_cast<unsigned char *>(j->keys_out);
    const uint64_t sign = 1ull << (j->key_size * 8 - 1);
    for (size_t i = 0; i < j->n; i++) {
        std::memcpy(kout + i * j->key_size, kin + idx[i] * j->key_size, j->key_size);
        /* HOSTILE: "Any transformations applied to the keys prior to sorting
         * are reversed while writing to the final output buffer", and -0.0
         * was transformed as +0.0: it comes out as +0.0. (CUB in CUDA 13.0
         * on an H100 kept -0.0's bits; the docs do not promise that.) */
        if (j->kind == 2 && load_key(kout, i, j->key_size) == sign)
            std::memset(kout + i * j->key_size, 0, j->key_size);
    }
    if (j->val_size) {
        const unsigned char *vin = static_cast<const unsigned char *>(j->vals_in);
        unsigned char *vout = static_cast<unsigned char *>(j->vals_out);
        for (size_t i = 0; i < j->n; i++)
            std::memcpy(vout + i * j->val_size, vin + idx[i] * j->val_size, j->val_size);
    }
    return cudaSuccess;
}

void free_job(void *p)
{
    delete static_cast<sort_job *>(p);
}

/* A pointer that is not device memory of the current device: on a GPU the
 * kernels would fault (sticky illegal address) or corrupt another
 * allocation; CUB checks nothing and has no error code for it, so the
 * emulator stops with a diagnostic instead of passing silently. */
void need_dev(const char *what, const void *p, size_t bytes, int device)
{
    int d = zs_emu_dev_ptr(p, bytes);
    if (d != device)
        zs_emu_fatal("cub::DeviceRadixSort",
                     "%s = %p (%zu bytes) is not inside one live device "
                     "allocation of the current device %d",
                     what, p, bytes, device);
}

bool meet(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = static_cast<const char *>(a), *y = static_cast<const char *>(b);
    return an && bn && x < y + bn && y < x + an;
}

} // namespace

extern "C" cudaError_t zs_emu_cub_sort_pairs(void *d_temp_storage, size_t *temp_storage_bytes,
                                             const void *d_keys_in, void *d_keys_out,
                                             const void *d_values_in, void *d_values_out,
                                             long long num_items, int key_kind, size_t key_size,
                                             size_t val_size, int begin_bit, int end_bit,
                                             cudaStream_t stream)
{
    if (!temp_storage_bytes || num_items < 0)
        return cudaErrorInvalidValue;
    /* begin_bit / end_bit: "The least-significant bit index (inclusive)" /
     * "The most-significant bit index (exclusive) needed for key comparison
     * (e.g., sizeof(unsigned int) * 8)". HOSTILE: a range outside the key
     * or reversed is refused (cudaErrorInvalidValue), not clamped. (CUB in
     * CUDA 13.0 on an H100 returned cudaSuccess for end_bit 33 and for
     * begin_bit > end_bit, and the device then faulted with an illegal
     * address: no caller can rely on such a range.) */
    if (begin_bit < 0 || end_bit > static_cast<int>(key_size * 8) || begin_bit > end_bit)
        return cudaErrorInvalidValue;
    const size_t n = static_cast<size_t>(num_items);
    const size_t need = temp_needed(n, key_size, val_size);
    /* d_temp_storage: "When nullptr, the required allocation size is written
     * to temp_storage_bytes and no work is done." */
    if (!d_temp_storage) {
        *temp_storage_bytes = need;
        return cudaSuccess;
    }
    /* Storage smaller than the query said: CUB's temporary-storage aliasing
     * fails with cudaErrorInvalidValue. */
    if (*temp_storage_bytes < need)
        return cudaErrorInvalidValue;

    const int device = zs_emu_current_device();
    const size_t kb = n * key_size, vb = n * val_size;
    need_dev("d_temp_storage", d_temp_storage, need, device);
    if (n) {
        need_dev("d_keys_in", d_keys_in, kb, device);
        need_dev("d_keys_out", d_keys_out, kb, device);
        if (val_size) {
            need_dev("d_values_in", d_values_in, vb, device);
            need_dev("d_values_out", d_values_out, vb, device);
        }
    }
    /* SortPairs docs: "In-place operations are not supported. There must be
     * no overlap between any of the provided ranges" (keys in/out, values
     * in/out). Overlap is undefined behaviour on a GPU, so it stops the
     * emulator. HOSTILE: the temporary storage may not overlap them either
     * (it is scribbled). */
    struct range {
        const char *name;
        const void *p;
        size_t n;
    } r[5] = {{"d_keys_in", d_keys_in, kb},
              {"d_keys_out", d_keys_out, kb},
              {"d_values_in", d_values_in, vb},
              {"d_values_out", d_values_out, vb},
              {"d_temp_storage", d_temp_storage, need}};
    for (int a = 0; a < 5; a++)
        for (int b = a + 1; b < 5; b++)
            if (meet(r[a].p, r[a].n, r[b].p, r[b].n))
                zs_emu_fatal("cub::DeviceRadixSort",
                             "%s [%p, +%zu) overlaps %s [%p, +%zu): the docs forbid any "
                             "overlap (no in-place sort)",
                             r[a].name, r[a].p, r[a].n, r[b].name, r[b].p, r[b].n);

    sort_job *j =
        new sort_job{d_temp_storage, need,     d_keys_in, d_keys_out, d_values_in, d_values_out, n,
                     key_size,       val_size, key_kind,  begin_bit,  end_bit,     device};
    return zs_emu_enqueue(stream, run_sort, j, free_job);
}
