/*
 * cub/device/device_radix_sort.cuh - the CUDA emulator's stand-in for CUB's
 * DeviceRadixSort (tests/cuda_emu/include comes first on the emulator's
 * include path, so this file replaces NVIDIA's). A thin template front end:
 * it classifies the key type (unsigned, signed, floating point) and hands
 * everything to zs_emu_cub_sort_pairs (emu_cub_sort.cpp), which validates,
 * answers the size query and enqueues the sort on the stream.
 *
 * Provides: cub::DeviceRadixSort::SortPairs and SortKeys, the pointer
 * overloads with (d_temp_storage, temp_storage_bytes, keys in/out,
 * [values in/out,] num_items, begin_bit, end_bit, stream), as documented in
 * CUB's device_radix_sort.cuh (CCCL, CUDA 13).
 *
 * Does not: DoubleBuffer overloads, descending sorts, decomposers
 * (user-defined keys), __half/__nv_bfloat16 keys, segmented sorts. Using one
 * of them fails to compile, which is the point: add it here first.
 */
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

extern "C" {
/* key_kind: 0 unsigned integer, 1 signed integer, 2 IEEE floating point.
 * val_size 0: no values (SortKeys). */
cudaError_t zs_emu_cub_sort_pairs(void *d_temp_storage, size_t *temp_storage_bytes,
                                  const void *d_keys_in, void *d_keys_out, const void *d_values_in,
                                  void *d_values_out, long long num_items, int key_kind,
                                  size_t key_size, size_t val_size, int begin_bit, int end_bit,
                                  cudaStream_t stream);
}

namespace cub
{

struct DeviceRadixSort {
  private:
    template <typename KeyT> static constexpr int key_kind()
    {
        static_assert(std::is_arithmetic<KeyT>::value && !std::is_same<KeyT, bool>::value,
                      "cuda-emu DeviceRadixSort: only built-in integer and floating-point keys");
        static_assert(sizeof(KeyT) == 1 || sizeof(KeyT) == 2 || sizeof(KeyT) == 4 ||
                          sizeof(KeyT) == 8,
                      "cuda-emu DeviceRadixSort: key size");
        return std::is_floating_point<KeyT>::value ? 2 : std::is_signed<KeyT>::value ? 1 : 0;
    }

  public:
    /* Sorts key-value pairs into ascending order (CUB docs: stable;
     * d_temp_storage nullptr = size query, no work; no overlap between the
     * four ranges; [begin_bit, end_bit) of the transformed key compared). */
    template <typename KeyT, typename ValueT, typename NumItemsT>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes,
                                 const KeyT *d_keys_in, KeyT *d_keys_out, const ValueT *d_values_in,
                                 ValueT *d_values_out, NumItemsT num_items, int begin_bit = 0,
                                 int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0)
    {
        static_assert(std::is_trivially_copyable<ValueT>::value,
                      "cuda-emu DeviceRadixSort: values are moved as bytes");
        static_assert(std::is_integral<NumItemsT>::value, "num_items is an integer");
        return zs_emu_cub_sort_pairs(d_temp_storage, &temp_storage_bytes, d_keys_in, d_keys_out,
                                     d_values_in, d_values_out, static_cast<long long>(num_items),
                                     key_kind<KeyT>(), sizeof(KeyT), sizeof(ValueT), begin_bit,
                                     end_bit, stream);
    }

    /* Sorts keys into ascending order (same rules, no values). */
    template <typename KeyT, typename NumItemsT>
    static cudaError_t SortKeys(void *d_temp_storage, size_t &temp_storage_bytes,
                                const KeyT *d_keys_in, KeyT *d_keys_out, NumItemsT num_items,
                                int begin_bit = 0, int end_bit = sizeof(KeyT) * 8,
                                cudaStream_t stream = 0)
    {
        static_assert(std::is_integral<NumItemsT>::value, "num_items is an integer");
        return zs_emu_cub_sort_pairs(d_temp_storage, &temp_storage_bytes, d_keys_in, d_keys_out,
                                     nullptr, nullptr, static_cast<long long>(num_items),
                                     key_kind<KeyT>(), sizeof(KeyT), 0, begin_bit, end_bit, stream);
    }
};

} // namespace cub
